// Which shared-memory hand-overs compute-sanitizer's racecheck takes as ordered. Each kernel hands
// 64 words from warps 0-1 to warps 2-3 (a, b: warps 0 and 1 to each other) in a way the PTX
// memory model orders; a hazard racecheck reports on one of them is the tool's, not the code's.
//   nvcc -arch=sm_90 -o /tmp/rb lab/probes/racecheck_barriers.cu
//   for k in 0 1 2 3 4; do compute-sanitizer --tool racecheck /tmp/rb $k; done
#include <cstdio>
#include <cstdlib>

__device__ unsigned smem_addr(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }
__device__ void named_sync(int id, int threads) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory"); }
__device__ void mbar_init(unsigned long long* b, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(b)), "r"(count) : "memory");
}
__device__ void mbar_arrive(unsigned long long* b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(b)) : "memory");
}
__device__ void mbar_wait(unsigned long long* b, int parity) {
  asm volatile(
      "{\n .reg .pred done;\n wait:\n mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n @!done bra wait;\n}\n" ::"r"(
          smem_addr(b)),
      "r"(parity)
      : "memory");
}

// 0: warp 0 writes, __syncthreads, warp 1 reads (the control: racecheck's own example)
// 1: the same over named barrier 1 for the 64 threads (bar.sync 1, 64)
// 2: warps 0-1 write, bar.sync 1 over them, thread 0 arrives on an mbarrier (count 1), warps 2-3 wait and read
// 3: warps 0-1 write and every thread arrives (count 64), warps 2-3 wait and read
// 4: like 2 with __syncthreads-free consumers reading after a named barrier of their own (bar.sync 2)
__global__ void hand_over(int mode, int* out) {
  __shared__ int words[64];
  __shared__ unsigned long long bar;
  int t = threadIdx.x;
  if (t == 0) mbar_init(&bar, mode == 3 ? 64 : 1);
  __syncthreads();
  if (mode <= 1) {
    if (t < 32) words[t] = t * 3 + 1;
    if (mode == 0) __syncthreads(); else if (t < 64) named_sync(1, 64);
    if (t >= 32 && t < 64) out[t] = words[63 - t];
    return;
  }
  if (t < 64) {
    words[t] = t * 3 + 1;
    if (mode == 3) {
      mbar_arrive(&bar);
    } else {
      named_sync(1, 64);
      if (t == 0) mbar_arrive(&bar);
    }
  } else {
    mbar_wait(&bar, 0);
    if (mode == 4) named_sync(2, 64);
    out[t] = words[127 - t];
  }
}

int main(int argc, char** argv) {
  int mode = argc > 1 ? atoi(argv[1]) : 0;
  int* out;
  cudaMalloc(&out, 128 * sizeof(int));
  hand_over<<<1, 128>>>(mode, out);
  int host[128];
  cudaMemcpy(host, out, sizeof host, cudaMemcpyDeviceToHost);
  int lo = mode <= 1 ? 32 : 64, hi = mode <= 1 ? 64 : 128, bad = 0;
  for (int t = lo; t < hi; ++t) bad += host[t] != ((mode <= 1 ? 63 - t : 127 - t) * 3 + 1);
  printf("mode %d: %s (%s)\n", mode, bad ? "WRONG" : "ok", cudaGetErrorString(cudaGetLastError()));
  return bad != 0;
}
