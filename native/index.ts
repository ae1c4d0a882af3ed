/** @specd/native typed facade over the addon (placeholder until the kernels land). */
export {};
