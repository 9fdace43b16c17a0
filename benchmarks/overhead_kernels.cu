// Trivial kernels for the launch-overhead baselines of bench_overhead: where does
// the time of a tiny launch go on this machine (host enqueue, stream kind, GPU)?
#include <cuda.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <vector>

namespace {
__global__ void add_one(float* p, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] += 1.f;
}
double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct BigArgs {
  float* p;
  long long pad[63];
};
__global__ void add_two(float* p, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] += 2.f;
}
__global__ void add_one_big(BigArgs a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) a.p[i] += 1.f;
}
}  // namespace

// µs per call of small runtime calls and of a launch with 512 bytes of parameters.
void runtime_call_report(float* p, int n, int count) {
  int dev = 0;
  double t0 = now_us();
  for (int i = 0; i < count; ++i) cudaGetDevice(&dev);
  double t1 = now_us();
  for (int i = 0; i < count; ++i) (void)cudaGetLastError();
  double t2 = now_us();
  BigArgs a{};
  a.p = p;
  for (int i = 0; i < count; ++i) add_one_big<<<1, 32>>>(a, n);
  cudaDeviceSynchronize();
  double t3 = now_us();
  std::printf("{\"workload\": \"rt_cudaGetDevice\", \"value\": %.3f, \"unit\": \"us/call\"}\n", (t1 - t0) / count);
  std::printf("{\"workload\": \"rt_cudaGetLastError\", \"value\": %.3f, \"unit\": \"us/call\"}\n", (t2 - t1) / count);
  std::printf("{\"workload\": \"raw_launch_512B_params\", \"value\": %.3f, \"unit\": \"us/op\"}\n", (t3 - t2) / count);
}

// Launches add_one `count` times on `stream`; returns the last error.
int launch_add_one(float* p, int n, int count, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  for (int i = 0; i < count; ++i) add_one<<<1, 32, 0, s>>>(p, n);
  return static_cast<int>(cudaGetLastError());
}

// Prints host-enqueue and end-to-end µs per launch for several stream kinds, and the
// per-kernel time of a CUDA graph replay (the GPU-side floor).
void launch_report(float* p, int n, int count) {
  cudaStream_t created;
  cudaStreamCreateWithFlags(&created, cudaStreamNonBlocking);
  struct Kind {
    const char* name;
    cudaStream_t s;
  } kinds[] = {{"legacy", nullptr}, {"per_thread", cudaStreamPerThread}, {"nonblocking", created}};
  for (auto& k : kinds) {
    for (int rep = 0; rep < 3; ++rep) {
      cudaDeviceSynchronize();
      double t0 = now_us();
      launch_add_one(p, n, count, k.s);
      double t1 = now_us();
      cudaStreamSynchronize(k.s);
      double t2 = now_us();
      if (rep == 2)
        std::printf("{\"workload\": \"raw_launch_%s\", \"value\": %.3f, \"unit\": \"us/op\", \"enqueue_us\": %.3f}\n",
                    k.name, (t2 - t0) / count, (t1 - t0) / count);
    }
  }
  // The same kernel through the driver's cuLaunchKernel with the CUfunction looked up once
  // (no linking to libcuda: the entry point comes from the runtime), and through
  // cudaLaunchKernel: is the runtime's per-launch lookup a visible part of a launch?
  {
    using LaunchFn = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                  CUstream, void**, void**);
    void* entry = nullptr;
    cudaDriverEntryPointQueryResult q{};
    cudaFunction_t fn = nullptr;
    if (cudaGetDriverEntryPointByVersion("cuLaunchKernel", &entry, 12000, cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess && cudaGetFuncBySymbol(&fn, reinterpret_cast<const void*>(add_one)) == cudaSuccess) {
      auto launch = reinterpret_cast<LaunchFn>(entry);
      float* pp = p;
      int nn = n;
      void* args[] = {&pp, &nn};
      for (int rep = 0; rep < 3; ++rep) {
        cudaDeviceSynchronize();
        double t0 = now_us();
        for (int i = 0; i < count; ++i)
          launch(reinterpret_cast<CUfunction>(fn), 1, 1, 1, 32, 1, 1, 0, reinterpret_cast<CUstream>(created), args, nullptr);
        double t1 = now_us();
        cudaStreamSynchronize(created);
        double t2 = now_us();
        if (rep == 2)
          std::printf("{\"workload\": \"raw_launch_driver_api\", \"value\": %.3f, \"unit\": \"us/op\", \"enqueue_us\": %.3f}\n",
                      (t2 - t0) / count, (t1 - t0) / count);
      }
      for (int rep = 0; rep < 3; ++rep) {
        cudaDeviceSynchronize();
        double t0 = now_us();
        for (int i = 0; i < count; ++i)
          cudaLaunchKernel(reinterpret_cast<const void*>(add_one), dim3(1), dim3(32), args, 0, created);
        cudaStreamSynchronize(created);
        double t1 = now_us();
        if (rep == 2)
          std::printf("{\"workload\": \"raw_launch_cudaLaunchKernel\", \"value\": %.3f, \"unit\": \"us/op\"}\n",
                      (t1 - t0) / count);
      }
    } else {
      (void)cudaGetLastError();
      std::printf("{\"workload\": \"raw_launch_driver_api\", \"value\": null, \"note\": \"no entry point\"}\n");
    }
  }
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  cudaStreamBeginCapture(created, cudaStreamCaptureModeThreadLocal);
  launch_add_one(p, n, count, created);
  cudaStreamEndCapture(created, &graph);
  cudaGraphInstantiate(&exec, graph, 0);
  for (int rep = 0; rep < 3; ++rep) {
    cudaDeviceSynchronize();
    double t0 = now_us();
    cudaGraphLaunch(exec, created);
    cudaStreamSynchronize(created);
    double t1 = now_us();
    if (rep == 2) std::printf("{\"workload\": \"graph_replay_per_kernel\", \"value\": %.3f, \"unit\": \"us/op\"}\n", (t1 - t0) / count);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(created);
}

// Batched launches: `count` tiny dependent launches recorded into batches of k and sent as one
// graph launch each, either by updating the nodes of a cached k-node chain
// (cudaGraphExecKernelNodeSetParams; `alternate` switches the kernel every node) or by stream
// capture + cudaGraphExecUpdate. Prints host µs/op for enqueue and end-to-end.
void batch_report(float* p, int n, int count) {
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  // Sends `count` launches as batches of k through `send_batch` (3 repeats, the last kept):
  // host µs/op until the last batch is sent (enq) and until the stream has finished (tot).
  auto time_batches = [&](int k, auto&& send_batch, double& enq, double& tot) {
    for (int rep = 0; rep < 3; ++rep) {
      cudaDeviceSynchronize();
      double t0 = now_us();
      for (int done = 0; done < count; done += k) send_batch();
      double t1 = now_us();
      cudaStreamSynchronize(s);
      double t2 = now_us();
      enq = (t1 - t0) / count;
      tot = (t2 - t0) / count;
    }
  };
  for (int k : {16, 32, 64, 128}) {
    for (int alternate = 0; alternate < 2; ++alternate) {
      cudaGraph_t g;
      cudaGraphCreate(&g, 0);
      std::vector<cudaGraphNode_t> nodes(k);
      float* pp = p;
      int nn = n;
      void* args[] = {&pp, &nn};
      cudaKernelNodeParams kp{};
      kp.func = reinterpret_cast<void*>(add_one);
      kp.gridDim = dim3(1);
      kp.blockDim = dim3(32);
      kp.kernelParams = args;
      for (int i = 0; i < k; ++i) cudaGraphAddKernelNode(&nodes[i], g, i ? &nodes[i - 1] : nullptr, i ? 1 : 0, &kp);
      cudaGraphExec_t e;
      double ti0 = now_us();
      cudaGraphInstantiate(&e, g, 0);
      double ti1 = now_us();
      double enq = 0, tot = 0;
      time_batches(k, [&] {
        for (int i = 0; i < k; ++i) {
          kp.func = reinterpret_cast<void*>(alternate && (i & 1) ? add_two : add_one);
          cudaGraphExecKernelNodeSetParams(e, nodes[i], &kp);
        }
        cudaGraphLaunch(e, s);
      }, enq, tot);
      std::printf("{\"workload\": \"batched_setparams_k%d%s\", \"value\": %.3f, \"unit\": \"us/op\", \"enqueue_us\": %.3f, "
                  "\"instantiate_us\": %.1f, \"err\": \"%s\"}\n",
                  k, alternate ? "_alt" : "", tot, enq, ti1 - ti0, cudaGetErrorString(cudaGetLastError()));
      // Disabling the tail: what a partial batch costs.
      double td0 = now_us();
      for (int i = k / 2; i < k; ++i) cudaGraphNodeSetEnabled(e, nodes[i], 0);
      for (int i = k / 2; i < k; ++i) cudaGraphNodeSetEnabled(e, nodes[i], 1);
      double td1 = now_us();
      if (alternate == 0)
        std::printf("{\"workload\": \"batched_node_enable_toggle_k%d\", \"value\": %.3f, \"unit\": \"us/call\"}\n", k,
                    (td1 - td0) / k);
      cudaGraphExecDestroy(e);
      cudaGraphDestroy(g);
    }
    // Stream capture into a side stream, then cudaGraphExecUpdate into a cached exec.
    cudaStream_t cs;
    cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking);
    cudaGraphExec_t e = nullptr;
    double enq = 0, tot = 0;
    time_batches(k, [&] {
      cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal);
      for (int i = 0; i < k; ++i) add_one<<<1, 32, 0, cs>>>(p, n);
      cudaGraph_t g;
      cudaStreamEndCapture(cs, &g);
      if (!e) {
        cudaGraphInstantiate(&e, g, 0);
      } else {
        cudaGraphExecUpdateResultInfo info;
        if (cudaGraphExecUpdate(e, g, &info) != cudaSuccess) std::printf("update failed\n");
      }
      cudaGraphDestroy(g);
      cudaGraphLaunch(e, s);
    }, enq, tot);
    std::printf("{\"workload\": \"batched_capture_update_k%d\", \"value\": %.3f, \"unit\": \"us/op\", \"enqueue_us\": %.3f, \"err\": \"%s\"}\n",
                k, tot, enq, cudaGetErrorString(cudaGetLastError()));
    cudaGraphExecDestroy(e);
    cudaStreamDestroy(cs);
  }
  cudaStreamDestroy(s);
}
