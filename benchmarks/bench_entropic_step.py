"""Training-step time and peak memory of the MNIST entropic p-WGAN configurations.

One step = generator forward on B latent codes, the release view, the entropic OT loss
W_{p,λ} against B privatized records, backward, Adam update — what ``EntropicWGAN.training_step``
does under the Trainer. Configurations (Reshetova et al. 2024):

* p = 2: Gaussian (ε, δ) = (35, 1e-4), Δ2 = 56 → σ = 10.145, λ = 2σ² (Fig. 3 top);
* p = 1: Laplace ε = 196, Δ1 = 1568 → b = 8, λ = b (Fig. 3 bottom);

on the shipped MNIST test split (8,000 privatized records), DCGAN generator (latent 100, hidden
128 as in the paper), with batch norm at B = 400 (§IV-B) and without at B = 6000 (§IV-F).

Each (p, B) runs in a fresh subprocess. Peak memory: the kernel's resident-set high-water mark
(VmHWM) is reset just before the first step (``/proc/self/clear_refs``) and read after the last;
the report gives its increase over the resident size before the steps, also in units of one B×B
float32 matrix (a B×B×784 intermediate would be 784 of them).
On a GPU, ``torch.cuda.max_memory_allocated`` is reported instead.

    python benchmarks/bench_entropic_step.py                       # p ∈ {1, 2}, B ∈ {400, 6000}
    python benchmarks/bench_entropic_step.py --batch-sizes 400 --p 2 --steps 5 --device cuda
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MNIST_TEST = REPO.parent / "shared" / "data" / "mnist-test"


def _status_bytes(key: str) -> int:
    """``VmRSS`` / ``VmHWM`` (resident set, its high-water mark) of this process, Linux."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) * 1024
    return 0


def _reset_peak() -> None:
    """Reset the kernel's resident-set high-water mark (Linux ≥ 4.0)."""
    Path("/proc/self/clear_refs").write_text("5")


def _peak(device: str, baseline_rss: int, bxb: int, what: str) -> dict:
    import torch

    if device.startswith("cuda"):
        peak = torch.cuda.max_memory_allocated()
        return {f"{what}_gpu_peak_allocated_bytes": peak, f"{what}_gpu_peak_in_BxB": peak / bxb}
    increase = max(_status_bytes("VmHWM") - baseline_rss, 0)
    return {f"{what}_peak_increase_bytes": increase, f"{what}_peak_in_BxB_float32": increase / bxb}


def run_single(p: int, batch: int, steps: int, warmup: int, device: str, cache_dir: str) -> dict:
    import torch

    from lightning_dpot.data import MNIST, PrivatizedDataModule
    from lightning_dpot.methods import EntropicWGAN
    from lightning_dpot.nn import DCGANGenerator

    mechanism = (
        {"mechanism": "gaussian", "epsilon": 35.0, "delta": 1e-4}
        if p == 2
        else {"mechanism": "laplace", "epsilon": 196.0}
    )
    datamodule = PrivatizedDataModule(
        MNIST(idx_dir=str(MNIST_TEST), split="test-only"),
        seed=0,
        batch_size=batch,
        cache_dir=cache_dir,
        **mechanism,
    )
    datamodule.setup("fit")
    module = EntropicWGAN(
        DCGANGenerator(batch_norm=batch <= 400), latent_range=(0.0, 1.0), lr=1e-4
    ).to(device)
    module.transform = datamodule.transform
    module.loss_fn = module.build_loss(datamodule)
    optimizer = torch.optim.Adam(module.generator.parameters(), lr=1e-4)
    real = datamodule.release[:batch].to(device)

    def step() -> float:
        fake = module.release_view(module(module.sample_latent(batch)))
        loss = module.compute_loss(fake, real)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return float(loss.detach())

    baseline_rss = _status_bytes("VmRSS")
    _reset_peak()
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    for _ in range(warmup):
        step()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    result = {
        "p": p,
        "batch": batch,
        "device": device,
        "threads": torch.get_num_threads(),
        "steps_timed": steps,
        "step_seconds_mean": sum(times) / len(times) if times else None,
        "step_seconds_all": times,
        "entropic_reg": module.entropic_reg,
        "batch_norm": batch <= 400,
    }
    bxb = batch * batch * 4
    if steps:
        result.update(_peak(device, baseline_rss, bxb, "step"))

    # The OT loss alone, forward + backward w.r.t. a generated batch: the part whose memory
    # must stay at a few B×B matrices (the generator's activations grow only like B).
    fake = (torch.rand(batch, real.shape[1], device=device) * 2 - 1).requires_grad_()
    baseline_rss = _status_bytes("VmRSS")
    _reset_peak()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    module.compute_loss(fake, real).backward()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    result["loss_seconds"] = time.perf_counter() - start
    result.update(_peak(device, baseline_rss, bxb, "loss"))
    return result


def summary_line(r: dict) -> str:
    mib = 2**20
    parts = [f"p={r['p']} B={r['batch']} {r['device']} threads={r['threads']}:"]
    if r.get("step_seconds_mean") is not None:
        parts.append(f"step {r['step_seconds_mean']:.2f} s")
        if "step_peak_increase_bytes" in r:
            parts.append(f"(peak +{r['step_peak_increase_bytes'] / mib:.0f} MiB)")
    parts.append(f"| loss fwd+bwd {r['loss_seconds']:.2f} s")
    if "loss_peak_increase_bytes" in r:
        parts.append(
            f"(peak +{r['loss_peak_increase_bytes'] / mib:.0f} MiB"
            f" = {r['loss_peak_in_BxB_float32']:.1f} B×B float32)"
        )
    return " ".join(parts)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[400, 6000])
    parser.add_argument("--p", type=int, nargs="+", default=[2, 1], choices=[1, 2])
    parser.add_argument(
        "--steps", type=int, default=2, help="timed steps per configuration (0: loss only)"
    )
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cache-dir", default=str(REPO / ".dpot_cache"))
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--single", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.single:
        import torch

        if args.threads:
            torch.set_num_threads(args.threads)
        result = run_single(
            args.p[0], args.batch_sizes[0], args.steps, args.warmup, args.device, args.cache_dir
        )
        print("RESULT " + json.dumps(result))
        return [result]

    results = []
    for p in args.p:
        for batch in args.batch_sizes:
            cmd = [sys.executable, __file__, "--single", "--p", str(p), "--batch-sizes", str(batch)]
            cmd += ["--steps", str(args.steps), "--warmup", str(args.warmup)]
            cmd += ["--device", args.device, "--cache-dir", args.cache_dir]
            if args.threads:
                cmd += ["--threads", str(args.threads)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            result = json.loads(out.split("RESULT ", 1)[1])
            results.append(result)
            print(summary_line(result), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
