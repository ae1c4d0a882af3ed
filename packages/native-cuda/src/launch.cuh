// @specd/native-cuda: kernel launches with programmatic dependent launch (PDL, sm_90+: the next kernel of the stream
// starts while this one drains, so its blocks are resident and its weights on their way when the data arrives).
// A kernel launched by specdLaunch must call pdlWait() before it reads what an earlier kernel wrote or writes what
// an earlier kernel reads: cudaGridDependencySynchronize waits for the whole previous grid and its memory, and
// because every kernel in the chain waits so, for everything before it too. pdlLaunchNext() lets the next kernel
// launch early (the CUDA programming guide, "Programmatic Dependent Launch and Synchronization").
#pragma once
#include <cuda_runtime.h>

#include <utility>

/** Whether launches use PDL: the device is sm_90 or newer and specdSetPdl(false) was not called (default on). */
bool specdPdlEnabled();
/** Turns PDL on or off for later launches (graphs captured before keep theirs). */
void specdSetPdl(bool on);

/** `kernel<<<grid, block, smem, stream>>>(args…)`, with the PDL attribute when specdPdlEnabled(). → its status. */
template <typename... KArgs, typename... Args>
cudaError_t specdLaunch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                        Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = specdPdlEnabled() ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

/** Waits for the previous kernel of the stream (and its memory); a no-op without PDL or before sm_90. */
__device__ __forceinline__ void pdlWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaGridDependencySynchronize();
#endif
}

/** Lets the next kernel of the stream launch now (it still waits in its own pdlWait); a no-op before sm_90. */
__device__ __forceinline__ void pdlLaunchNext() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaTriggerProgrammaticLaunchCompletion();
#endif
}
