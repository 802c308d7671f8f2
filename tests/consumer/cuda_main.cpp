// An engine's view of the cuda component: the CUDA engine links from the installed
// package. It does not need a GPU to link; with none visible it says so and stops.
#include <cuda_runtime_api.h>

#include <cstdio>

#include "radixtier/cuda/cuda_transfer_engine.hpp"

int main() {
  // volatile: the reference must survive optimization so the linker pulls the engine in.
  using Create = radixtier::Result<std::unique_ptr<radixtier::cuda::CudaTransferEngine>> (*)(
      radixtier::cuda::CudaPools, radixtier::cuda::CudaEngineOptions);
  const Create volatile create = &radixtier::cuda::CudaTransferEngine::create;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("consumer: cuda linked (create at %s); no device visible\n",
                create != nullptr ? "an address" : "null");
    return 0;
  }
  std::printf("consumer: cuda linked; %d device(s)\n", devices);
  return 0;
}
