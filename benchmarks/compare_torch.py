#!/usr/bin/env python3
"""Side-by-side timings: tapegrad's benchmark programs against the same workloads in PyTorch.

Runs tg_bench_gpu, tg_bench_cpu, tg_bench_interop, tg_bench_amp, ... (from --bench-dir) or reads their JSON lines from files
(--tg-json), times PyTorch with the same method (warm-up discarded, median of >= 10 repeats,
torch.cuda.Event for device work, host clock + synchronize for host-side workloads), and
prints a table LAST: workload | tapegrad | PyTorch | ratio | target.

ratio is tapegrad relative to the baseline in the workload's own unit: for throughputs
(TFLOP/s, GB/s) tapegrad / PyTorch (higher is better); for times (ms, us/op) tapegrad's
time / PyTorch's time (lower is better). Exit status: 0 unless a program failed (or, with
--strict, a target was missed).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# workload -> (label, direction, target). direction "higher": throughput; "lower": time.
# target: ("ratio", op, x) compares the ratio; ("abs", op, x) compares tapegrad's value.
WORKLOADS = [
    ("matmul_fp32", "matmul 8000 fp32", "higher", ("ratio", ">=", 0.97)),
    ("matmul_tf32", "matmul 8000 tf32", "higher", ("ratio", ">=", 0.97)),
    ("matmul_fp16", "matmul 8000 fp16", "higher", ("ratio", ">=", 0.97)),
    ("matmul_bf16", "matmul 8000 bf16", "higher", ("ratio", ">=", 0.97)),
    ("add_2^28", "add 2^28 fp32", "higher", ("ratio", ">=", 0.95)),
    ("standardize_1Mx64", "standardize 1Mx64", "lower", ("ratio", "<=", 0.5, " (2x faster)")),
    ("cpu_8000x8000", "cpu() 8000^2 fp32", "lower", ("ratio", "<=", 0.2, " (5x faster)")),
    ("to_vector_8000x8000", "to_vector 8000^2", "lower", None),  # vs torch .cpu(); for information
    # Into pageable host memory touched before (no page faults): copy_to_host vs torch's h.copy_(x).
    ("pageable_reused_8000x8000", "D2H 8000^2 into reused pageable", "higher", None),
    ("dependent_adds_16", "1000 dep. adds x16", "lower", ("abs", "<=", 4.0)),
    ("cpu_matmul_1024", "CPU matmul 1024 (vs Eigen)", "higher", ("ratio", ">=", 0.9)),
    # Autograd (#3) and training (#4), from tg_bench_overhead.
    ("matmul_grad_8000", "fwd+bwd sum(x @ y) 8000 fp32", "lower", ("ratio", "<=", 1.02)),
    ("autograd_chain_2000_fwd_bwd", "2000-op grad chain x16, fwd+bwd", "lower", ("abs", "<=", 8.0)),
    ("regression_epoch", "regression epoch 1Mx64 (245 steps)", "lower", ("abs", "<=", 15.0)),
    # Interop (#6), from tg_bench_interop. The first row's baseline is tapegrad's built-in multiply.
    ("ewk_mul_10M_f64", "ElementwiseKernel mul 10M f64 (vs built-in)", "higher", ("ratio", ">=", 0.95)),
    ("vectorize_mul_10M_host", "vectorize mul 10M f64, host arrays", "lower", ("ratio", "<=", 0.2, " (5x faster)")),
    ("rtc_disk_cache_ms", "RawKernel from disk cache, new process", "lower", ("abs", "<=", 5.0)),
    # Mixed precision (#5), from tg_bench_amp: the seed's AMP loop, Linear(4096, 4096) + SGD + GradScaler,
    # against PyTorch eager with torch.autocast + torch.amp.GradScaler. amp_fp16_vs_fp32's baseline is our
    # own float32 loop (fp16 must be faster); the peak row compares torch.cuda.max_memory_allocated.
    ("amp_train_fp16", "AMP train step fp16 (Linear 4096)", "lower", ("abs", "<=", 200.0)),
    ("amp_train_bf16", "AMP train step bf16 (Linear 4096)", "lower", None),
    ("amp_train_fp32", "train step fp32, no AMP (Linear 4096)", "lower", None),
    ("amp_fp16_vs_fp32", "AMP fp16 step vs our fp32 step", "lower", ("ratio", "<=", 1.0)),
    ("amp_train_fp16_peak_mib", "AMP fp16 peak GPU memory", "lower", ("ratio", "<=", 1.0)),
    # CUDA graphs (#6): the AMP fp16 step above captured into a tg::cuda::Graph and replayed (tg_bench_amp), and
    # the regression epoch captured whole and replayed once per epoch (tg_bench_overhead). Absolute targets, no
    # PyTorch side. The graph row is timed in a process of its own, as a training program runs it: after the
    # eager AMP loops in the same process, buffers land elsewhere and the same replay took 4% longer
    # (benchmarks/NOTES.md, session 3); that figure is the row below it.
    ("amp_train_fp16_graph", "AMP fp16 step replayed as a CUDA graph", "lower", ("abs", "<=", 150.0)),
    ("amp_train_fp16_graph_shared", "  same, after the eager AMP loops in one process", "lower", None),
    ("regression_epoch_graph", "regression epoch 1Mx64 as a CUDA graph", "lower", ("abs", "<=", 8.0)),
    # ---- issue 15: softmax / cross_entropy fwd+bwd (tg_bench_softmax; its JSON also has GB_per_s)
    ("softmax_fwd_bwd_16384x4096_fp32", "softmax fwd+bwd 16384x4096 fp32", "lower", ("ratio", "<=", 0.77, " (1.3x faster)")),
    ("softmax_fwd_bwd_16384x4096_bf16", "softmax fwd+bwd 16384x4096 bf16", "lower", ("ratio", "<=", 0.77, " (1.3x faster)")),
    ("softmax_fwd_bwd_4096x50304_fp32", "softmax fwd+bwd 4096x50304 fp32", "lower", ("ratio", "<=", 0.77, " (1.3x faster)")),
    ("softmax_fwd_bwd_4096x50304_bf16", "softmax fwd+bwd 4096x50304 bf16", "lower", ("ratio", "<=", 0.77, " (1.3x faster)")),
    ("cross_entropy_fwd_bwd_16384x50304_bf16", "cross_entropy fwd+bwd 16384x50304 bf16", "lower", ("abs", "<=", 1.0)),
    # ---- issue 15: whole models (tg_bench_models). MNIST-shaped MLP 784-512-512-10, batch 128, cross_entropy +
    # Adam, 60000 rows on the GPU, device shuffle; us/step over one epoch (469 steps). The graph row has no
    # PyTorch side of its own: its baseline is PyTorch eager, as in the table.
    ("mlp_mnist_epoch", "MLP 784-512-512-10 epoch, eager", "lower", ("abs", "<=", 100.0)),
    ("mlp_mnist_epoch_graph", "MLP 784-512-512-10 epoch, CUDA graph", "lower", ("abs", "<=", 50.0)),
    # ---- issue 15: normalization, embedding, dropout (tg_bench_norm). Speed targets as time ratios:
    # 1.5x faster is ratio <= 1/1.5. PyTorch 2.11 on the H200: 0.369 / 0.315 / 0.355 / 0.226 / 0.870 ms.
    ("layer_norm_fwd_bwd_32768x768_fp32", "layer_norm fwd+bwd [32768, 768] fp32", "lower",
     ("ratio", "<=", 1 / 1.5, " (1.5x faster)")),
    ("layer_norm_fwd_bwd_32768x768_bf16", "layer_norm fwd+bwd [32768, 768] bf16", "lower",
     ("ratio", "<=", 1 / 1.5, " (1.5x faster)")),
    ("layer_norm_fwd_bwd_8192x4096_fp32", "layer_norm fwd+bwd [8192, 4096] fp32", "lower",
     ("ratio", "<=", 1 / 1.3, " (1.3x faster)")),
    ("layer_norm_fwd_bwd_8192x4096_bf16", "layer_norm fwd+bwd [8192, 4096] bf16", "lower",
     ("ratio", "<=", 1 / 1.3, " (1.3x faster)")),
    ("embedding_fwd_bwd_50304x768_32768", "embedding fwd+bwd 50304x768 fp32, 32768 idx", "lower",
     ("ratio", "<=", 1 / 1.2, " (1.2x faster)")),
    # ---- issue 16: gradient clipping (tg_bench_clip) over GPT-2 124M's 148 float32 gradients; PyTorch:
    # torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True) / get_total_norm(grads, foreach=True). The
    # *_vs_copy rows compare with the time the traffic takes (norm: 1 read; clip: 2 reads, 1 write) at the DRAM
    # bandwidth a 1 GiB device-to-device copy reaches in the same run (METHOD.md's measured ceiling; first row),
    # the *_vs_dram rows at the datasheet's 4.8 TB/s.
    ("dram_copy_GB_per_s", "DRAM ceiling: 1 GiB device-to-device copy, GB/s read+written", "higher", None),
    ("clip_grad_norm_gpt2_124m_fp32", "clip_grad_norm_ GPT-2 124M fp32", "lower",
     ("ratio", "<=", 1 / 1.5, " (1.5x faster)")),
    ("clip_grad_norm_gpt2_124m_fp32_vs_copy", "  same vs 3 passes at the measured copy bandwidth", "lower", None),
    ("clip_grad_norm_gpt2_124m_fp32_vs_dram", "  same vs 3 passes at 4.8 TB/s", "lower", None),
    ("grad_norm_gpt2_124m_fp32", "total grad norm GPT-2 124M fp32", "lower", None),
    ("grad_norm_gpt2_124m_fp32_vs_copy", "  same vs 1 read at the measured copy bandwidth", "lower",
     ("ratio", "<=", 1.1)),
    ("grad_norm_gpt2_124m_fp32_vs_dram", "  same vs 1 read at 4.8 TB/s", "lower", None),
    # ---- issue 18: SDPA causal bf16 (tg_bench_attention); FLOPs 4 B H T^2 D / 2 forward, x3.5 fwd+bwd.
    # PyTorch 2.11 on the H200 (flash): 0.192 / 0.743 ms and 1.80 / 7.61 ms.
    ("sdpa_causal_bf16_B32_H12_T1024_D64_fwd", "SDPA causal bf16 B32 H12 T1024 D64 fwd", "lower",
     ("ratio", "<=", 1 / 1.1, " (1.1x faster)")),
    ("sdpa_causal_bf16_B32_H12_T1024_D64_fwd_bwd", "SDPA causal bf16 B32 H12 T1024 D64 fwd+bwd", "lower",
     ("ratio", "<=", 1 / 1.1, " (1.1x faster)")),
    # The same with use_deterministic_algorithms(false) on tapegrad's side (cuDNN's atomic dQ): PyTorch's
    # default flash backward is of that class, so its row is PyTorch's fwd+bwd figure again.
    ("sdpa_causal_bf16_B32_H12_T1024_D64_fwd_bwd_atomic_dq", "  same, both with atomic dQ (tapegrad non-deterministic)",
     "lower", ("ratio", "<=", 1 / 1.1, " (1.1x faster)")),
    ("sdpa_causal_bf16_B4_H16_T8192_D128_fwd", "SDPA causal bf16 B4 H16 T8192 D128 fwd", "lower", None),
    ("sdpa_causal_bf16_B4_H16_T8192_D128_fwd_tflops", "  same, TFLOP/s", "higher", ("abs", ">=", 650.0)),
    ("sdpa_causal_bf16_B4_H16_T8192_D128_fwd_bwd", "SDPA causal bf16 B4 H16 T8192 D128 fwd+bwd", "lower", None),
    ("sdpa_causal_bf16_B4_H16_T8192_D128_fwd_bwd_tflops", "  same, TFLOP/s", "higher", ("abs", ">=", 540.0)),
    ("sdpa_causal_bf16_B4_H16_T8192_D128_fwd_bwd_atomic_dq", "  same, both with atomic dQ (tapegrad non-deterministic)",
     "lower", None),
    ("sdpa_causal_bf16_B4_H16_T8192_D128_fwd_bwd_atomic_dq_tflops", "  same, atomic dQ, TFLOP/s", "higher",
     ("abs", ">=", 540.0)),

    # ---- issue 17: convolutions (tg_bench_cnn). ResNet-18 (10 classes), batch 512 of 3x32x32, AMP fp16 +
    # GradScaler, SGD momentum, ms/step. Baseline: PyTorch eager, channels_last, cudnn.benchmark (8.07 ms on the
    # H200); the graph row has the same baseline. The "vs" rows compare our eager step with PyTorch's other
    # settings from the same call (8.52 ms without cudnn.benchmark, torch.compile 14.6 ms). Speed >= 1.0x is
    # time ratio <= 1; speed >= 0.5x is time ratio <= 2.
    ("resnet18_amp_step", "ResNet-18 AMP fp16 train step b512 (vs eager+benchmark)", "lower",
     ("ratio", "<=", 0.8, " (1.25x faster)")),
    ("resnet18_amp_step_graph", "  same step as a CUDA graph (vs eager+benchmark)", "lower", ("ratio", "<=", 0.7)),
    ("resnet18_amp_step_vs_nobench", "  our eager step vs PyTorch eager, no cudnn.benchmark", "lower", None),
    ("resnet18_amp_step_vs_compile", "  our eager step vs PyTorch torch.compile", "lower", None),
    ("resnet18_amp_step_vs_nchw", "  our eager step vs PyTorch eager NCHW + benchmark", "lower", None),
    ("conv2d_3x3_64_56x56_b128_bf16_fwd_bwd", "conv2d 3x3 64->64 56x56 b128 bf16 fwd+bwd (PyTorch NHWC)", "lower",
     ("ratio", "<=", 1.0)),
    ("cpu_conv2d_3x3_32_32x32_b16_fp32_fwd", "CPU conv2d 3x3 32->32 32x32 b16 fp32 fwd", "lower", ("ratio", "<=", 2.0)),
    # ---- issue 16: the DataLoader feeding a GPU-bound consumer (tg_bench_cnn; tapegrad only): the ResNet-18 step
    # above, its batches from a DataLoader (50000 uint8 3x32x32 in host memory, 4 workers, pinned, normalised on
    # the GPU) against the same batches resident on the GPU; the loss is fed / resident - 1.
    ("resnet18_amp_dataloader_loss", "ResNet-18 AMP step fed by a DataLoader: time lost", "lower",
     ("abs", "<=", 0.05, " (5%)")),
    ("resnet18_amp_dataloader_step", "  step fed by the DataLoader (4 workers)", "lower", None),
    ("resnet18_amp_dataloader_resident_step", "  step on the batches resident on the GPU", "lower", None),

    # ---- issue 18: GPT-2 124M train step (tg_bench_gpt2: examples/gpt2.h's model), B=32 T=1024 vocab 50304, bf16
    # autocast, AdamW (fused), clip_grad_norm_(1.0); PyTorch: the nanoGPT-style model below (flash SDPA), eager and
    # torch.compile. The first row's baseline is eager, the second's torch.compile (target 1.1x); peak memory
    # against eager; time to first step (model built to first step done) against torch.compile's.
    ("gpt2_124m_train_step_b32_t1024_bf16", "GPT-2 124M train step B=32 T=1024 bf16 (vs eager)", "higher",
     ("abs", ">=", 580000.0, " tok/s")),
    ("gpt2_124m_train_step_b32_t1024_bf16_vs_compile", "  same vs torch.compile", "higher",
     ("ratio", ">=", 1.1)),
    ("gpt2_124m_train_step_b32_t1024_bf16_peak_gib", "  peak GPU memory (vs eager)", "lower", ("abs", "<=", 31.0)),
    ("gpt2_124m_train_step_b32_t1024_bf16_graph", "  same step as one CUDA graph (vs eager)", "higher",
     ("abs", ">=", 580000.0, " tok/s")),
    ("gpt2_124m_first_step", "GPT-2 124M time to first step (vs torch.compile)", "lower", ("abs", "<=", 5.0)),

    # ---- issue 14: autograd (tg_bench_autograd). Hessian-vector product of sum((x @ y)^2) at 8000^2 fp32:
    # forward, grad(create_graph=True), grad(g, x, v); the create_graph chain row reports its ratio to the
    # plain chain (autograd_chain_2000_fwd_bwd, tg_bench_overhead's row) in the program's JSON.
    ("hvp_matmul_8000_fp32", "HVP sum((x@y)^2) 8000^2 fp32 (double backward)", "lower", ("ratio", "<=", 1.05)),
    ("autograd_chain_2000_fwd_bwd_create_graph", "2000-op chain fwd+bwd with create_graph", "lower", None),
]
# Rows whose tapegrad figure is another row's (the same program result against another PyTorch setting).
TG_ALIASES = {
    # ---- issue 17
    "resnet18_amp_step_vs_nobench": "resnet18_amp_step",
    "resnet18_amp_step_vs_compile": "resnet18_amp_step",
    "resnet18_amp_step_vs_nchw": "resnet18_amp_step",
}


def median_of(fn, warmup, reps):
    for _ in range(warmup):
        fn()
    return statistics.median(fn() for _ in range(reps))


def torch_timings(warmup, reps, only):
    """Times the GPU workloads in PyTorch; returns {workload: (value, unit)}."""
    try:
        import torch
    except ImportError:
        print("compare_torch: PyTorch is not installed; tapegrad's numbers only", file=sys.stderr)
        return {}
    if not torch.cuda.is_available():
        print("compare_torch: PyTorch sees no CUDA device; tapegrad's numbers only", file=sys.stderr)
        return {}
    out = {}
    wants = lambda w: not only or only in w

    def event_ms(fn):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

        def once():
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)

        torch.cuda.synchronize()
        return median_of(once, warmup, reps)

    def wall_ms(fn):
        def once():
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            return (time.perf_counter() - t0) * 1e3

        torch.cuda.synchronize()
        return median_of(once, warmup, reps)

    n = 8000
    flops = 2.0 * n**3
    for name, dtype, tf32 in [("matmul_fp32", torch.float32, False), ("matmul_tf32", torch.float32, True),
                              ("matmul_fp16", torch.float16, False), ("matmul_bf16", torch.bfloat16, False)]:
        if not wants(name):
            continue
        torch.backends.cuda.matmul.allow_tf32 = tf32
        sets = [(torch.rand(n, n, device="cuda").to(dtype), torch.rand(n, n, device="cuda").to(dtype)) for _ in range(3)]
        i = [0]

        def mm():
            a, b = sets[i[0] % 3]
            i[0] += 1
            return a @ b

        ms = event_ms(mm)
        out[name] = (flops / (ms * 1e-3) / 1e12, "TFLOP/s")
        del sets
    torch.backends.cuda.matmul.allow_tf32 = False

    if wants("add_2^28"):
        n_add = 1 << 28
        a, b = torch.rand(n_add, device="cuda"), torch.rand(n_add, device="cuda")
        ms = event_ms(lambda: a + b)
        out["add_2^28"] = (3 * 4 * n_add / (ms * 1e-3) / 1e9, "GB/s")
        del a, b
    if wants("standardize"):
        x = torch.rand(1_000_000, 64, device="cuda")
        out["standardize_1Mx64"] = (event_ms(lambda: (x - x.mean(0)) / x.std(0)), "ms")
        del x
    if wants("cpu_8000") or wants("to_vector_8000"):
        x = torch.rand(8000, 8000, device="cuda")
        ms = wall_ms(lambda: x.cpu())
        out["cpu_8000x8000"] = (ms, "ms")
        out["to_vector_8000x8000"] = (ms, "ms")
        del x
    if wants("pageable_reused_8000"):
        x = torch.rand(8000, 8000, device="cuda")
        h = torch.zeros(8000, 8000)  # pageable, touched
        ms = wall_ms(lambda: h.copy_(x))
        out["pageable_reused_8000x8000"] = (8000 * 8000 * 4 / (ms * 1e-3) / 1e9, "GB/s")
        del x, h
    if wants("dependent_adds"):
        x = torch.rand(16, device="cuda")

        def chain():
            y = x
            for _ in range(1000):
                y = y + x
            return y

        out["dependent_adds_16"] = (wall_ms(chain) * 1e3 / 1000, "us/op")
    if wants("matmul_grad_8000"):
        xg = torch.randn(8000, 8000, device="cuda", requires_grad=True)
        yg = torch.randn(8000, 8000, device="cuda")

        def fwd_bwd():
            xg.grad = None
            (xg @ yg).sum().backward()

        out["matmul_grad_8000"] = (event_ms(fwd_bwd), "ms")
        del xg, yg
    if wants("autograd_chain_2000"):
        w = torch.rand(16, device="cuda", requires_grad=True)

        def grad_chain():
            y = w
            for _ in range(2000):
                y = y + w
            y.sum().backward()
            w.grad = None

        out["autograd_chain_2000_fwd_bwd"] = (wall_ms(grad_chain) * 1e3 / 2000, "us/op")
    if wants("regression_epoch"):
        # The seed's "preprocess on the GPU, then train" epoch, PyTorch eager with fused Adam and
        # device-side shuffling (randperm + index), not the literal DataLoader (far slower).
        raw = torch.rand(1_000_000, 64, device="cuda")
        feat = ((raw - raw.mean(0)) / raw.std(0)).contiguous()
        yr = torch.randn(1_000_000, 1, device="cuda")
        net = torch.nn.Sequential(torch.nn.Linear(64, 1)).cuda()
        adam = torch.optim.Adam(net.parameters(), fused=True)

        def epoch():
            perm = torch.randperm(feat.shape[0], device="cuda")
            for i in range(0, feat.shape[0], 4096):
                idx = perm[i:i + 4096]
                xb, yb = feat[idx], yr[idx]
                adam.zero_grad()
                loss = torch.nn.functional.mse_loss(net(xb), yb)
                loss.backward()
                adam.step()

        out["regression_epoch"] = (wall_ms(epoch), "ms")
        del raw, feat, yr
    if wants("vectorize_mul_10M_host"):
        # The seed's numba @vectorize(target='cuda') multiply, the PyTorch way: host arrays in, host array out.
        a = torch.rand(10_000_000, dtype=torch.float64)
        b = torch.rand(10_000_000, dtype=torch.float64)
        out["vectorize_mul_10M_host"] = (wall_ms(lambda: (a.cuda() * b.cuda()).cpu()), "ms")
        del a, b
    # ---- issue 15: whole models
    if wants("mlp_mnist_epoch"):
        # PyTorch eager, fused Adam, device-side shuffle (randperm + index), as the regression epoch above.
        torch.manual_seed(0)
        xm = torch.rand(60000, 784, device="cuda")
        ym = torch.randint(0, 10, (60000,), device="cuda")
        mlp = torch.nn.Sequential(torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                  torch.nn.ReLU(), torch.nn.Linear(512, 10)).cuda()
        adam = torch.optim.Adam(mlp.parameters(), fused=True)

        def mlp_epoch():
            perm = torch.randperm(60000, device="cuda")
            for i in range(0, 60000, 128):
                idx = perm[i:i + 128]
                adam.zero_grad()
                loss = torch.nn.functional.cross_entropy(mlp(xm[idx]), ym[idx])
                loss.backward()
                adam.step()

        us = wall_ms(mlp_epoch) * 1e3 / 469
        out["mlp_mnist_epoch"] = (us, "us/step")
        out["mlp_mnist_epoch_graph"] = (us, "us/step")
        del xm, ym, mlp, adam
    # The seed's AMP loop (tg_bench_amp): 100 steps per repeat, us/step; peak memory of the fp16 run.
    for name, dt in [("amp_train_fp16", torch.float16), ("amp_train_bf16", torch.bfloat16), ("amp_train_fp32", None)]:
        if not (wants(name) or (name == "amp_train_fp16" and wants("amp_train_fp16_peak_mib"))):
            continue
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        torch.manual_seed(0)
        model = torch.nn.Linear(4096, 4096).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        scaler = torch.amp.GradScaler("cuda", enabled=dt is not None)

        def hundred_steps():
            for _ in range(100):
                inp = torch.randn(256, 4096, device="cuda")
                opt.zero_grad()
                with torch.autocast("cuda", dtype=dt or torch.float16, enabled=dt is not None):
                    loss = model(inp).pow(2).mean()
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()

        out[name] = (event_ms(hundred_steps) * 1e3 / 100, "us/step")
        if name == "amp_train_fp16":
            out["amp_train_fp16_peak_mib"] = (torch.cuda.max_memory_allocated() / 2**20, "MiB")
        del model, opt, scaler
    # ---- issue 15: softmax / cross_entropy fwd+bwd, the same steps as tg_bench_softmax
    for rows, cols, dt, tag in [(16384, 4096, torch.float32, "fp32"), (16384, 4096, torch.bfloat16, "bf16"),
                                (4096, 50304, torch.float32, "fp32"), (4096, 50304, torch.bfloat16, "bf16")]:
        name = f"softmax_fwd_bwd_{rows}x{cols}_{tag}"
        if not wants(name):
            continue
        xs = torch.randn(rows, cols, device="cuda").to(dt).requires_grad_(True)
        gs = torch.randn(rows, cols, device="cuda").to(dt)

        def softmax_step():
            xs.grad = None
            torch.softmax(xs, -1).backward(gs)

        out[name] = (event_ms(softmax_step), "ms")
        del xs, gs
    if wants("cross_entropy_fwd_bwd_16384x50304_bf16"):
        xc = torch.randn(16384, 50304, device="cuda").to(torch.bfloat16).requires_grad_(True)
        tc = torch.randint(0, 50304, (16384,), device="cuda")

        def ce_step():
            xc.grad = None
            torch.nn.functional.cross_entropy(xc, tc).backward()

        out["cross_entropy_fwd_bwd_16384x50304_bf16"] = (event_ms(ce_step), "ms")
        del xc, tc
    # ---- issue 15: normalization, embedding, dropout (as tg_bench_norm: 10 iterations per timed repeat)
    for rows, cols, dt, dname in [(32768, 768, torch.float32, "fp32"), (32768, 768, torch.bfloat16, "bf16"),
                                  (8192, 4096, torch.float32, "fp32"), (8192, 4096, torch.bfloat16, "bf16")]:
        name = f"layer_norm_fwd_bwd_{rows}x{cols}_{dname}"
        if not wants(name):
            continue
        xl = torch.randn(rows, cols, device="cuda", dtype=dt, requires_grad=True)
        wl = torch.randn(cols, device="cuda", dtype=dt, requires_grad=True)
        bl = torch.randn(cols, device="cuda", dtype=dt, requires_grad=True)
        gl = torch.randn(rows, cols, device="cuda", dtype=dt)

        def ln_iters():
            for _ in range(10):
                xl.grad = wl.grad = bl.grad = None
                torch.nn.functional.layer_norm(xl, (cols,), wl, bl).backward(gl)

        out[name] = (event_ms(ln_iters) / 10, "ms")
        del xl, wl, bl, gl
    if wants("embedding_fwd_bwd_50304x768_32768"):
        we = torch.randn(50304, 768, device="cuda", requires_grad=True)
        ie = torch.randint(0, 50304, (32768,), device="cuda")
        ge = torch.randn(32768, 768, device="cuda")

        def emb_iters():
            for _ in range(10):
                we.grad = None
                torch.nn.functional.embedding(ie, we).backward(ge)

        out["embedding_fwd_bwd_50304x768_32768"] = (event_ms(emb_iters) / 10, "ms")
        del we, ie, ge
    # ---- issue 16: gradient clipping (as tg_bench_clip: 10 calls per timed repeat, value in us)
    if wants("clip_grad_norm_gpt2_124m_fp32") or wants("grad_norm_gpt2_124m_fp32"):
        d = 768
        shapes = [(50257, d), (1024, d)]
        for _ in range(12):
            shapes += [(d,), (d,), (d, 3 * d), (3 * d,), (d, d), (d,), (d,), (d,), (d, 4 * d), (4 * d,), (4 * d, d), (d,)]
        shapes += [(d,), (d,)]
        torch.manual_seed(0)
        ps = [torch.zeros(s, device="cuda", requires_grad=True) for s in shapes]
        for p_ in ps:
            p_.grad = torch.randn(p_.shape, device="cuda")
        gs = [p_.grad for p_ in ps]

        def clip_iters():  # max_norm 1e-7, as tg_bench_clip: every call scales (PyTorch scales even by 1)
            for _ in range(10):
                torch.nn.utils.clip_grad_norm_(ps, 1e-7, foreach=True)

        if wants("clip_grad_norm_gpt2_124m_fp32"):
            out["clip_grad_norm_gpt2_124m_fp32"] = (event_ms(clip_iters) * 100, "us")
        if wants("grad_norm_gpt2_124m_fp32") and hasattr(torch.nn.utils, "get_total_norm"):  # PyTorch >= 2.6

            def norm_iters():
                for _ in range(10):
                    torch.nn.utils.get_total_norm(gs, 2.0, foreach=True)

            out["grad_norm_gpt2_124m_fp32"] = (event_ms(norm_iters) * 100, "us")
        del ps, gs
    # ---- issue 14: Hessian-vector product through double backward, the same calls as tg_bench_autograd
    if wants("hvp_matmul_8000_fp32"):
        torch.backends.cuda.matmul.allow_tf32 = False
        hx = torch.randn(8000, 8000, device="cuda", requires_grad=True)
        hy, hv = torch.randn(8000, 8000, device="cuda"), torch.randn(8000, 8000, device="cuda")

        def hvp():
            f = (hx @ hy).pow(2).sum()
            g, = torch.autograd.grad(f, hx, create_graph=True)
            torch.autograd.grad(g, hx, hv)

        out["hvp_matmul_8000_fp32"] = (event_ms(hvp), "ms")
        del hx, hy, hv
    # ---- issue 18: SDPA causal bf16, the same calls as tg_bench_attention
    for B, H, T, D in [(32, 12, 1024, 64), (4, 16, 8192, 128)]:
        base = f"sdpa_causal_bf16_B{B}_H{H}_T{T}_D{D}"
        if not wants(base):
            continue
        fwd_flops = 4.0 * B * H * T * T * D / 2
        qa, ka, va, ga = (torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        sdpa = torch.nn.functional.scaled_dot_product_attention
        if wants(base + "_fwd"):
            with torch.no_grad():
                ms = event_ms(lambda: sdpa(qa, ka, va, is_causal=True))
            out[base + "_fwd"] = (ms, "ms")
            out[base + "_fwd_tflops"] = (fwd_flops / (ms * 1e-3) / 1e12, "TFLOP/s")
        if wants(base + "_fwd_bwd"):
            qr, kr, vr = (t.detach().requires_grad_(True) for t in (qa, ka, va))

            def sdpa_step():
                qr.grad = kr.grad = vr.grad = None
                sdpa(qr, kr, vr, is_causal=True).backward(ga)

            ms = event_ms(sdpa_step)
            out[base + "_fwd_bwd"] = (ms, "ms")
            out[base + "_fwd_bwd_tflops"] = (3.5 * fwd_flops / (ms * 1e-3) / 1e12, "TFLOP/s")
            # PyTorch's default backward is already the atomic-dQ kind: the like-for-like row's baseline.
            out[base + "_fwd_bwd_atomic_dq"] = out[base + "_fwd_bwd"]
            out[base + "_fwd_bwd_atomic_dq_tflops"] = out[base + "_fwd_bwd_tflops"]
            del qr, kr, vr
        del qa, ka, va, ga

    # ---- issue 17: convolutions, as tg_bench_cnn (input drawn once; 10 steps / calls per timed repeat)
    if any(wants(k) for k in ("resnet18_amp_step", "resnet18_amp_step_graph", "resnet18_amp_step_vs_nobench",
                              "resnet18_amp_step_vs_compile", "resnet18_amp_step_vs_nchw")):
        try:
            import torchvision
        except ImportError:
            torchvision = None
            print("compare_torch: no torchvision; the ResNet-18 rows have no PyTorch side", file=sys.stderr)

        def resnet_step_ms(channels_last, benchmark, compiled):
            torch.backends.cudnn.benchmark = benchmark
            torch.manual_seed(0)
            model = torchvision.models.resnet18(num_classes=10).cuda()
            xr = torch.randn(512, 3, 32, 32, device="cuda")
            yr = torch.randint(0, 10, (512,), device="cuda")
            if channels_last:
                model = model.to(memory_format=torch.channels_last)
                xr = xr.contiguous(memory_format=torch.channels_last)
            sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
            scaler = torch.amp.GradScaler("cuda")
            fwd = torch.compile(model) if compiled else model

            def ten_steps():
                for _ in range(10):
                    sgd.zero_grad()
                    with torch.autocast("cuda", dtype=torch.float16):
                        loss = torch.nn.functional.cross_entropy(fwd(xr), yr)
                    scaler.scale(loss).backward()
                    scaler.step(sgd)
                    scaler.update()

            ten_steps()  # cudnn.benchmark's search, torch.compile's compilation
            try:
                return event_ms(ten_steps) / 10
            finally:
                torch.backends.cudnn.benchmark = False

        if torchvision is not None:
            for key, cl, bench, comp in [("resnet18_amp_step", True, True, False),
                                         ("resnet18_amp_step_vs_nobench", True, False, False),
                                         ("resnet18_amp_step_vs_nchw", False, True, False),
                                         ("resnet18_amp_step_vs_compile", True, True, True)]:
                if comp and os.environ.get("TG_BENCH_NO_COMPILE") == "1":
                    continue  # torch.compile takes a minute or more to compile the step
                try:
                    out[key] = (resnet_step_ms(cl, bench, comp), "ms")
                except Exception as e:  # torch.compile may be unavailable (no triton, no compiler)
                    print(f"compare_torch: PyTorch {key}: {e}", file=sys.stderr)
            if "resnet18_amp_step" in out:
                out["resnet18_amp_step_graph"] = out["resnet18_amp_step"]
            torch.cuda.empty_cache()
    if wants("conv2d_3x3_64_56x56_b128_bf16_fwd_bwd"):
        torch.backends.cudnn.benchmark = True
        torch.manual_seed(0)
        xc = torch.randn(128, 64, 56, 56, device="cuda").to(torch.bfloat16)
        xc = xc.contiguous(memory_format=torch.channels_last).requires_grad_(True)
        wc = (torch.randn(64, 64, 3, 3, device="cuda") * 0.04).to(torch.bfloat16)
        wc = wc.contiguous(memory_format=torch.channels_last).requires_grad_(True)
        gc = torch.randn(128, 64, 56, 56, device="cuda").to(torch.bfloat16).contiguous(memory_format=torch.channels_last)

        def conv_iters():
            for _ in range(10):
                yc = torch.nn.functional.conv2d(xc, wc, padding=1)
                torch.autograd.grad(yc, (xc, wc), gc)

        out["conv2d_3x3_64_56x56_b128_bf16_fwd_bwd"] = (event_ms(conv_iters) / 10, "ms")
        torch.backends.cudnn.benchmark = False
        del xc, wc, gc

    # ---- issue 18: GPT-2 124M train step, nanoGPT-style (as tg_bench_gpt2: wall clock around a synchronised step)
    if wants("gpt2_124m"):
        out.update(gpt2_timings(torch, warmup, reps))
    torch.cuda.empty_cache()
    return out


def torch_cpu_timings(warmup, reps, only):
    """PyTorch's CPU rows (no GPU needed); {workload: (value, unit)}."""
    try:
        import torch
    except ImportError:
        return {}
    out = {}
    wants = lambda w: not only or only in w
    # ---- issue 17: CPU conv2d forward, as tg_bench_cnn (10 calls per timed repeat, host clock)
    if wants("cpu_conv2d_3x3_32_32x32_b16_fp32_fwd"):
        torch.manual_seed(0)
        x = torch.randn(16, 32, 32, 32)
        w = torch.randn(32, 32, 3, 3) * 0.06

        def ten():
            t0 = time.perf_counter()
            with torch.no_grad():
                for _ in range(10):
                    torch.nn.functional.conv2d(x, w, padding=1)
            return (time.perf_counter() - t0) * 1e3 / 10

        out["cpu_conv2d_3x3_32_32x32_b16_fp32_fwd"] = (median_of(ten, warmup, reps), "ms")
    return out


def nanogpt_model(torch, n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50304):
    """nanoGPT's GPT (model.py), without dropout: flash SDPA, tanh GELU, lm_head tied to wte."""
    nn, F = torch.nn, torch.nn.functional

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn, self.c_proj = nn.Linear(n_embd, 3 * n_embd), nn.Linear(n_embd, n_embd)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = (t.view(B, T, n_head, C // n_head).transpose(1, 2) for t in self.c_attn(x).split(C, dim=2))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(n_embd), Attention(), nn.LayerNorm(n_embd)
            self.c_fc, self.c_proj = nn.Linear(n_embd, 4 * n_embd), nn.Linear(4 * n_embd, n_embd)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab_size, n_embd), nn.Embedding(block_size, n_embd)
            self.h = nn.ModuleList(Block() for _ in range(n_layer))
            self.ln_f = nn.LayerNorm(n_embd)
            self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
            self.wte.weight = self.lm_head.weight

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
            for block in self.h:
                x = block(x)
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    return GPT()


def gpt2_timings(torch, warmup, reps, B=32, T=1024, V=50304):
    out = {}
    name = "gpt2_124m_train_step_b32_t1024_bf16"
    for mode in ("eager", "compile"):
        if mode == "compile" and os.environ.get("TG_BENCH_NO_COMPILE") == "1":
            continue
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        t_build = time.perf_counter()
        torch.manual_seed(0)
        model = nanogpt_model(torch).cuda()
        params = list(model.parameters())
        opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                                 {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                                lr=6e-4, betas=(0.9, 0.95), fused=True)
        fwd = torch.compile(model) if mode == "compile" else model
        rows = torch.randint(0, V, (B, T + 1), device="cuda")
        x, y = rows[:, :-1].contiguous(), rows[:, 1:].contiguous()

        def step():
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = fwd(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()

        step()
        torch.cuda.synchronize()
        first = time.perf_counter() - t_build

        def once():
            t0 = time.perf_counter()
            step()
            torch.cuda.synchronize()
            return (time.perf_counter() - t0) * 1e3

        ms = median_of(once, warmup, reps)
        tok_s = B * T / (ms * 1e-3)
        if mode == "eager":
            out[name] = (tok_s, "tok/s")
            out[name + "_graph"] = (tok_s, "tok/s")
            out[name + "_peak_gib"] = (torch.cuda.max_memory_allocated() / 2**30, "GiB")
        else:
            out[name + "_vs_compile"] = (tok_s, "tok/s")
            out["gpt2_124m_first_step"] = (first, "s")
        print(f"compare_torch: nanoGPT 124M {mode}: {ms:.1f} ms/step, {tok_s:.0f} tok/s, "
              f"peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB, first step {first:.1f} s", file=sys.stderr)
        del model, opt, fwd, params
    return out


def run_tg_programs(bench_dir, reps, only):
    """Runs the C++ benchmark programs; returns (parsed JSON records, failed program names)."""
    records, failed = [], []
    for prog in ("tg_bench_gpu", "tg_bench_cpu", "tg_bench_interop", "tg_bench_amp", "tg_bench_overhead",
                 # ---- issue 15: softmax / cross_entropy, whole models, normalization / embedding
                 "tg_bench_softmax", "tg_bench_models", "tg_bench_norm",
                 # ---- issue 16: gradient clipping
                 "tg_bench_clip",
                 # ---- issue 18: attention
                 "tg_bench_attention",
                 # ---- issue 17: convolutions
                 "tg_bench_cnn",
                 # ---- issue 18: GPT-2 train step
                 "tg_bench_gpt2",
                 # ---- issue 14: double backward, create_graph overhead
                 "tg_bench_autograd"):
        path = os.path.join(bench_dir, prog)
        if not os.path.exists(path):
            print(f"compare_torch: {path} not found (build with -DTG_BUILD_BENCHMARKS=ON)", file=sys.stderr)
            failed.append(prog)
            continue
        cmd = [path, "--reps", str(reps)] + (["--only", only] if only else [])
        print("compare_torch: running", " ".join(cmd), file=sys.stderr, flush=True)
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
        got = parse_lines(proc.stdout.splitlines())
        if prog == "tg_bench_amp" and any(r.get("workload") == "amp_train_fp16_graph" for r in got):
            # The graph workload again, alone in a fresh process (see ROWS); the shared-process figure stays.
            for r in got:
                if r.get("workload") == "amp_train_fp16_graph":
                    r["workload"] = "amp_train_fp16_graph_shared"
            alone = [path, "--reps", str(reps), "--only", "amp_train_fp16_graph"]
            print("compare_torch: running", " ".join(alone), file=sys.stderr, flush=True)
            p2 = subprocess.run(alone, stdout=subprocess.PIPE, text=True)
            got += [r for r in parse_lines(p2.stdout.splitlines()) if r.get("workload") == "amp_train_fp16_graph"]
            if p2.returncode != 0:
                failed.append(prog + " (graph alone)")
        records += got
        if proc.returncode != 0:
            print(f"compare_torch: {prog} exited with {proc.returncode}", file=sys.stderr)
            failed.append(prog)
    return records, failed


def parse_lines(lines):
    records = []
    for line in lines:
        line = line.strip()
        if line.startswith("{"):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                print(f"compare_torch: not JSON: {line}", file=sys.stderr)
    return records


def fmt(v, unit):
    if v is None:
        return "-"
    return f"{v:.3g} {unit}" if abs(v) < 1000 else f"{v:.0f} {unit}"


def table(tg, base):
    """Returns (rows as lists of strings, number of missed targets)."""
    rows, missed = [], 0
    for key, label, direction, target in WORKLOADS:
        rec = tg.get(key)
        tv, unit = (rec["value"], rec["unit"]) if rec else (None, "")
        if rec and "baseline" in rec:  # a baseline the program measured itself (Eigen, tg's built-in op)
            bv, bunit = rec["baseline"], rec["unit"] + f" ({rec.get('baseline_name', 'Eigen')})"
        else:
            bv, bunit = base.get(key, (None, unit))
        ratio = tv / bv if tv is not None and bv else None
        verdict, tstr = "", "-"
        if target:
            kind, op, x, note = (tuple(target) + ("",))[:4]
            tstr = f"{'ratio' if kind == 'ratio' else 'value'} {op} {x:g}{note}"
            got = ratio if kind == "ratio" else tv
            if got is not None:
                ok = got >= x if op == ">=" else got <= x
                verdict = "ok" if ok else "MISS"
                missed += not ok
        rows.append([label, fmt(tv, unit), fmt(bv, bunit if bv is not None else ""),
                     f"{ratio:.3f}x" if ratio is not None else "-", tstr, verdict])
    return rows, missed


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bench-dir", help="directory holding tg_bench_gpu / tg_bench_cpu / tg_bench_interop (a build's benchmarks/)")
    p.add_argument("--tg-json", nargs="*", default=[], help="files of JSON lines written by the programs instead")
    p.add_argument("--reps", type=int, default=15, help="repeats per workload (>= 10)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--only", default="", help="only workloads whose name contains this")
    p.add_argument("--no-torch", action="store_true", help="skip PyTorch")
    p.add_argument("--json-out", help="write all measurements here as JSON")
    p.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    a = p.parse_args()
    a.reps = max(10, a.reps)

    records, failed = [], []
    if a.bench_dir:
        records, failed = run_tg_programs(a.bench_dir, a.reps, a.only)
    for path in a.tg_json:
        with open(path) as f:
            records += parse_lines(f)
    tg = {r["workload"]: r for r in records}
    for alias, src in TG_ALIASES.items():
        if src in tg and alias not in tg:
            tg[alias] = tg[src]
    base = {} if a.no_torch else torch_timings(a.warmup, a.reps, a.only)
    if not a.no_torch:
        base.update(torch_cpu_timings(a.warmup, a.reps, a.only))

    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"tapegrad": tg, "pytorch": {k: {"value": v, "unit": u} for k, (v, u) in base.items()}}, f,
                      indent=1)

    rows, missed = table(tg, base)
    head = ["workload", "tapegrad", "PyTorch", "ratio", "target", ""]
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"
    print()
    print(line(head))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print(line(r))
    print(f"({missed} target(s) missed; ratio: tapegrad / baseline in the row's unit"
          f"{'; failed: ' + ', '.join(failed) if failed else ''})")
    sys.exit(1 if failed or (a.strict and missed) else 0)


if __name__ == "__main__":
    main()
