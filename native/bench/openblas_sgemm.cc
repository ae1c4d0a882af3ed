// Bench-only comparison: OpenBLAS cblas_sgemm / cblas_sgemv with fp32 weights W [n, k] (OpenBLAS
// 0.3.21 on Debian has no bf16 GEMM), Y[m, n] = X[m, k] . W^T, for m = 1..16.
// Built and run by native/bench/kernels.mjs when /usr/include/x86_64-linux-gnu/cblas.h exists
// (apt-get install libopenblas-dev); never part of the addon.
//   g++ -O2 openblas_sgemm.cc -lopenblas -o openblas_sgemm && ./openblas_sgemm 16384 8192 5
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  const long n = argc > 1 ? std::atol(argv[1]) : 16384;
  const long k = argc > 2 ? std::atol(argv[2]) : 8192;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 5;
  std::vector<float> w(static_cast<size_t>(n * k)), x(static_cast<size_t>(16 * k)), y(static_cast<size_t>(16 * n));
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>((i * 2654435761u) % 1000) * 1e-5f - 0.005f;
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 997) * 1e-3f - 0.5f;
  auto time_ms = [&](int m) {
    double best = 1e30;
    for (int r = 0; r <= reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      if (m == 1) {
        cblas_sgemv(CblasRowMajor, CblasNoTrans, n, k, 1.0f, w.data(), k, x.data(), 1, 0.0f, y.data(), 1);
      } else {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, x.data(), k, w.data(), k, 0.0f, y.data(),
                    n);
      }
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (r > 0) best = std::min(best, ms);  // r = 0 is the warm-up
    }
    return best;
  };
  std::printf("openblas threads %d, fp32 weights %ld MiB\n", openblas_get_num_threads(), n * k * 4 >> 20);
  const double t1 = time_ms(1);
  for (int m = 1; m <= 16; ++m) {
    const double t = m == 1 ? t1 : time_ms(m);
    std::printf("%d %.3f %.3f %.1f\n", m, t, t / t1, 2.0 * m * n * k / t / 1e6);
  }
  return 0;
}
