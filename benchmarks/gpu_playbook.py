"""GPU playbook: DP-Sinkhorn and DPSWflow-r on full Fashion-MNIST at target (ε, δ) = (10, 1e-5),
each at several run lengths, sized to a time budget and scored like Cao et al. 2021, Table 1.

    python benchmarks/gpu_playbook.py --data-dir /usr/share/datasets/fashion-mnist \\
        --budget-minutes 40 --out docs/results/gpu_playbook

Everything below ends within ``--budget-minutes`` (the clock starts with the script; a reserve
of 15 % is kept for what the plan cannot see):

1. **Measure.** The shortest run of each method (``--probe-steps`` steps) is a full run of the
   ladder: σ calibrated for its length, evaluated like every run. A callback times each of its
   steps (CUDA-synchronized); the median after a warm-up is the step time, the rest of its fit
   the set-up, and its evaluation the evaluation time. A few steps of the autoencoder (no
   privacy: the public half) are timed the same way. DPSWflow-r is measured only if more than
   the reserve is left after DP-Sinkhorn.
2. **Plan.** The autoencoder gets the paper's 30 epochs or what fits in a sixth of the budget.
   Each method gets a geometric ladder T_k = T_top / r^k (k = 0, …, K − 1; ``--ratio`` r,
   ``--rungs`` K at most) whose predicted cost Σ_k (set-up + T_k · step + evaluation) fits its
   share of the time left (``allocate``, ``ladder``), with T_top capped at the paper's
   budget: 280,000 steps of expected batch 50 for DP-Sinkhorn on Fashion-MNIST (Cao et al.
   2021, App. D.4), 35 epochs of 120 steps of b = 250 for DPSWflow-r (Sebag et al. 2023,
   App. C). The plan is logged and written to ``plan.json``.
3. **Run** the ladders, shortest run first, through the package's suite runner
   (``lightning_dpot.compare.runner.run_cell`` on ``configs/compare/fashion_gpu_playbook.yaml``
   with ``trainer.max_steps = T``): one ``dpot fit`` per run with σ calibrated for its T steps
   (``target_epsilon``), the ε of the run's own accountant, and the suite's evaluation: the
   classifier Fréchet distance (``lightning_dpot.metrics.fid``) and the downstream LogReg / MLP /
   CNN of Cao et al. 2021, App. D.2 (``lightning_dpot.metrics.utility``, full protocol: trained
   on labelled synthetic samples, early-stopped on a synthetic hold-out, tested once on the
   10,000 real test images). A run whose predicted cost no longer fits the time left is skipped
   and listed; a run that fails is listed with its traceback (``errors/<run>.txt``), the others
   go on, and the exit status is 1.
4. **Write** ``--out``: ``runs/<method>_<T>steps.json`` per run, ``samples/<run>.png``,
   ``summary.json`` (device name, torch version, step times, wall time, plan, every run),
   ``results.md`` (the table) and ``accuracy_vs_steps.png``, after every run.

**Resumable.** A second call with the same settings reuses ``plan.json`` (so the ladder is the
same) and every run whose JSON in ``--out`` carries the same fingerprint (composed config,
overrides, δ, evaluation, autoencoder; ``lightning_dpot.compare.runner.cell_fingerprint``);
a run interrupted in ``--work-dir`` (checkpoints, caches) resumes from its checkpoint.

**One private run across time-limited jobs.** ``--single-run dp_sinkhorn --steps 280000
--job-minutes 50 --state DIR`` trains one run of the paper's length (``PAPER_STEPS``) across
as many calls as it takes, each call one job (a cluster's time limit, a preemption):

    python benchmarks/gpu_playbook.py --data-dir /usr/share/datasets/fashion-mnist \\
        --single-run dp_sinkhorn --steps 280000 --job-minutes 50 --state /scratch/dps_280k

The first job fixes the plan in ``DIR/run.json`` (σ calibrated once, for the planned length:
``target_epsilon`` with ``trainer.max_steps = --steps``); a later job asking for another length
or other settings is refused in one line. Each job resumes the run in ``DIR`` (given to it from
the previous job's output, at any path: the runner names the moved release journal to the
accountant, which checks it against the checkpoint), trains until the next step would end past
``--job-minutes`` less ``--margin-minutes`` (``JobClock``: the checkpoint is written inside
the last batch, and every ``--checkpoint-minutes``), writes ``DIR/progress.json`` (steps done
and planned, ε so far, σ, jobs) and exits 0 with a line saying what is left ("run again to
continue"). The training steps' latents continue from the checkpoint
(``lightning_dpot.callbacks.TrainingRngStream``), so the jobs make the uninterrupted run.
The job that reaches the planned length scores the run like the ladder's runs and writes
``--out`` (default ``DIR/results``).

Every run is a separate private run of the same records: each ε holds for its run alone
(sequential composition over runs). ``--tiny`` shrinks models and batches for a CPU check of the
whole path on the first 100 images of each split; its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import hashlib
import json
import logging
import math
import platform
import statistics
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STARTED = time.monotonic()  # the budget's clock starts before the heavy imports
REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run from a checkout without installing the package
    sys.path.insert(0, str(REPO))

import lightning as L  # noqa: E402
import torch  # noqa: E402
from typing_extensions import override  # noqa: E402

from lightning_dpot.callbacks import TrainingRngStream  # noqa: E402
from lightning_dpot.compare.lengths import length_table, plot_against_steps, run_point  # noqa: E402
from lightning_dpot.compare.published import PublishedResult, published_table  # noqa: E402
from lightning_dpot.compare.runner import (  # noqa: E402
    cell_fingerprint,
    digest_matches,
    record_failure,
    run_cell,
    run_prepare,
    score_cell,
    train_cell,
    write_json,
)
from lightning_dpot.compare.suite import (  # noqa: E402
    Cell,
    MethodSpec,
    PrepareSpec,
    Suite,
    check_inception_weights,
    load_suite,
    with_inception_weights,
)
from lightning_dpot.data.images import IDX_FILES, find_idx_file  # noqa: E402
from lightning_dpot.grids import images_to_grid  # noqa: E402

SUITE = REPO / "configs" / "compare" / "fashion_gpu_playbook.yaml"
METHODS = ("dp_sinkhorn", "dpswflow_r")
AUTOENCODER = "autoencoder"
SOURCE = "fashion_mnist"

#: The papers' Fashion-MNIST numbers at (ε, δ) = (10, 1e-5), from the suites' one table
#: (``configs/compare/published/fashion_mnist.yaml``, named by the suite).
PUBLISHED = {entry.method: entry for entry in load_suite(SUITE).published}
#: The papers' training lengths: the cap of each ladder.
PAPER_STEPS = {method: PUBLISHED[method].steps for method in METHODS}
#: The methods ``--single-run`` continues across jobs (DPSWflow-r reaches its paper length in
#: one short loan).
SINGLE_RUN_METHODS = ("dp_sinkhorn",)
#: The autoencoder of Sebag et al. 2023, App. C.1: 30 epochs on the public half.
PAPER_AUTOENCODER_EPOCHS = 30

RESERVE_SHARE = 0.15  # of the budget, kept back from the plan
AUTOENCODER_SHARE = 1 / 6  # of the budget, at most, for the autoencoder's epochs
AUTOENCODER_PROBE_STEPS = 20
WARMUP_STEPS = 3  # untimed steps at the start of every timed run

#: ``--tiny``: the first 100 images of each split, small models and every record in every batch
#: (q = 1, so that calibrating σ and the privacy reports take no time): a CPU check of the whole
#: path, numbers meaningless.
TINY = {
    "source": {"limit": 100},
    "dp_sinkhorn": {
        "model.init_args.generator.init_args.hidden_channels": [8, 4, 2],
        "data.init_args.expected_batch_size": None,
        "data.init_args.sample_rate": 1.0,
    },
    "dpswflow_r": {
        "model.init_args.num_particles": 50,
        "model.init_args.num_directions": 10,
        "data.init_args.batch_size": 50,  # the private half of 100 images
    },
    AUTOENCODER: {"data.init_args.batch_size": 50},
    "evaluation": {"num_samples": 50, "grid": 20},
}


# -- timing and planning (pure) ------------------------------------------------------------------
class StepTimer(L.Callback):
    """Wall time of every training batch (forward, loss, backward, optimizer step), synchronized
    with the GPU so that queued kernels are counted in their own step."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._start = 0.0

    @staticmethod
    def _sync(pl_module: L.LightningModule) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)

    @override
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._sync(pl_module)
        self._start = time.perf_counter()

    @override
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._sync(pl_module)
        self.seconds.append(time.perf_counter() - self._start)

    def step_seconds(self) -> float:
        """Median step time after the warm-up steps (all steps if there are no more)."""
        timed = self.seconds[WARMUP_STEPS:] or self.seconds
        return statistics.median(timed)


@dataclass
class PlaybookRun:
    """One scored run, as ``runs/<run>.json`` holds it: the suite cell's record (method,
    length, privacy, metrics, fit and evaluation times), σ, the measured step and set-up times,
    the machine, the fingerprint of its settings and, for ``--single-run``, its jobs."""

    run: str
    method: str
    method_class: str
    planned_steps: int
    steps: int
    target_epsilon: float
    privacy: dict[str, Any]
    noise_multiplier: float | None
    epsilon_pld: float | None
    metrics: dict[str, Any]
    step_seconds: float
    setup_seconds: float
    fit_seconds: float
    evaluate_seconds: float
    device: str
    torch: str
    tiny: bool
    fingerprint: str
    cell_dir: str
    jobs: int | None = None


@dataclass(frozen=True)
class Timing:
    """What a run of T steps costs: set-up + T · step + evaluation (seconds)."""

    step_seconds: float
    setup_seconds: float
    evaluate_seconds: float

    def predict(self, steps: int) -> float:
        return self.setup_seconds + steps * self.step_seconds + self.evaluate_seconds


def round_steps(steps: float) -> int:
    """``steps`` rounded down to two significant digits (1,475 → 1,400; 262 → 260)."""
    steps *= 1 + 1e-9  # 99.99999… from a division is 100
    if steps < 100:
        return int(steps)
    unit = 10 ** (int(math.log10(steps)) - 1)
    return int(steps // unit * unit)


def ladder(
    timing: Timing, seconds: float, probe_steps: int, cap: int, ratio: float, rungs: int
) -> list[int]:
    """A geometric ladder T_top / r^k, k = K − 1, …, 0, above the probe run whose predicted cost
    Σ_k (set-up + T_k · step + evaluation) fits in ``seconds``.

    T_top(K) = (seconds − K · (set-up + evaluation)) / (step · Σ_k r^−k), capped at ``cap``. K
    is the largest count ≤ ``rungs`` whose shortest run is at least twice the probe's length and
    whose T_top is at least half of T_top(1), the longest single run that fits: more points are
    not bought with most of the reach toward the paper's budget. Returns the step counts,
    shortest first ([] when not even one run fits)."""
    fixed = timing.setup_seconds + timing.evaluate_seconds

    def top(count: int) -> float:
        weight = sum(ratio**-k for k in range(count))
        return min((seconds - count * fixed) / (max(timing.step_seconds, 1e-9) * weight), cap)

    for count in range(rungs, 0, -1):
        steps = [round_steps(top(count) / ratio**k) for k in reversed(range(count))]
        if steps[0] >= 2 * probe_steps and len(set(steps)) == count and top(count) >= top(1) / 2:
            return steps
    return []


def ladder_seconds(timing: Timing, steps: list[int]) -> float:
    return sum(timing.predict(t) for t in steps)


def allocate(
    seconds: float,
    timings: dict[str, Timing],
    probe_steps: int,
    caps: dict[str, int],
    ratio: float,
    rungs: int,
) -> dict[str, list[int]]:
    """One ladder per method (``ladder``) within ``seconds`` in all.

    Each method gets the cost of its shortest useful run (twice the probe), cheapest first, as
    long as they fit; the rest is shared equally on top, and what a method whose ladder reaches
    its cap (the paper's budget) leaves is shared among the others."""
    shortest = {m: t.predict(2 * probe_steps) for m, t in timings.items()}
    funded: list[str] = []
    for m in sorted(timings, key=shortest.__getitem__):
        if sum(shortest[f] for f in funded) + shortest[m] <= seconds:
            funded.append(m)
    plans: dict[str, list[int]] = {m: [] for m in timings}
    remaining = seconds
    while funded:
        extra = (remaining - sum(shortest[m] for m in funded)) / len(funded)
        for m in funded:
            plans[m] = ladder(timings[m], shortest[m] + extra, probe_steps, caps[m], ratio, rungs)
        capped = [m for m in funded if plans[m] and plans[m][-1] >= caps[m]]
        if not capped or len(capped) == len(funded):
            break
        for m in capped:
            remaining -= ladder_seconds(timings[m], plans[m])
            funded.remove(m)
    return plans


def autoencoder_epochs(seconds: float, steps_per_epoch: int, step_seconds: float) -> int:
    """Epochs of the autoencoder that fit in ``seconds`` (at least 1, at most the paper's 30)."""
    fit = int(seconds // max(steps_per_epoch * step_seconds, 1e-9))
    return max(1, min(PAPER_AUTOENCODER_EPOCHS, fit))


# -- one private run across time-limited jobs ----------------------------------------------------
class JobClock(L.Callback):
    """Ends a job's training before its time limit, with a checkpoint.

    After every training batch: when the next step would end after ``deadline`` (a
    ``time.monotonic`` time; a step is taken to last as long as the longest of the job's last 20)
    or the job has taken ``job_steps`` steps, it writes the checkpoint ``path`` and stops
    training. It also writes ``path`` every ``every`` seconds (a job killed without notice
    repeats at most that much training, whose releases its journal still counts) and after the
    run's last step. The checkpoint is written inside the batch, so the next job continues the
    same epoch of Poisson masks, as the uninterrupted run does."""

    def __init__(
        self, path: Path, deadline: float | None, job_steps: int | None, every: float
    ) -> None:
        self.path, self.deadline, self.job_steps, self.every = path, deadline, job_steps, every
        self.steps = 0
        self.ended_by: str | None = None
        self._recent: deque[float] = deque(maxlen=20)
        self._start = self._saved = time.monotonic()

    @override
    def on_train_start(self, trainer, pl_module) -> None:
        self._saved = time.monotonic()

    @override
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._start = time.monotonic()

    @override
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        now = time.monotonic()
        self._recent.append(now - self._start)
        self.steps += 1
        if trainer.global_step >= trainer.max_steps:
            self.ended_by = "planned length"
        elif trainer.should_stop:  # the accountant: the next step would pass the target
            self.ended_by = "privacy budget"
        elif self.job_steps is not None and self.steps >= self.job_steps:
            self.ended_by = "--job-steps"
        elif self.deadline is not None and now + max(self._recent) > self.deadline:
            self.ended_by = "time limit"
        if self.ended_by is not None or now - self._saved >= self.every:
            trainer.save_checkpoint(self.path)
            self._saved = time.monotonic()
        if self.ended_by is not None:
            trainer.should_stop = True


def data_digest(folder: Path) -> str:
    """SHA-256 of the four IDX files' contents (decompressed): the data's name in a run's
    fingerprint, wherever a job finds them."""
    digest = hashlib.sha256()
    for names in IDX_FILES.values():
        for name in names:
            path = find_idx_file(folder, name)
            assert path is not None  # parse_args checked
            with (gzip.open if path.suffix == ".gz" else open)(path, "rb") as fh:
                for chunk in iter(lambda fh=fh: fh.read(1 << 20), b""):
                    digest.update(chunk)
    return digest.hexdigest()


def refuse(message: str) -> SystemExit:
    """The one line a job that would change its run ends with (exit status 1)."""
    return SystemExit(f"gpu_playbook: {message}")


# -- the playbook --------------------------------------------------------------------------------
class Playbook:
    """The suite sized for this device and budget, its runs and its report (module docstring)."""

    def __init__(self, args: argparse.Namespace, started: float | None = None) -> None:
        self.args = args
        self.start = time.monotonic() if started is None else started
        self.budget = args.budget_minutes * 60.0
        self.out = Path(args.out).resolve()
        self.work = Path(args.state if args.single_run else args.work_dir).resolve()
        self.accelerator = "gpu" if args.device == "cuda" else "cpu"
        self.device_name = (
            torch.cuda.get_device_name() if args.device == "cuda" else f"cpu ({platform.machine()})"
        )
        self.base = load_suite(SUITE)
        self.runs: dict[str, PlaybookRun] = {}
        self.reused: list[str] = []
        self.skipped: list[dict] = []
        self.failed: list[dict] = []
        for folder in (self.out / "runs", self.out / "samples", self.work):
            folder.mkdir(parents=True, exist_ok=True)

    # -- clock and log ---------------------------------------------------------------------------
    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def left(self) -> float:
        return self.budget - self.elapsed()

    def log(self, message: str) -> None:
        print(f"[gpu_playbook {self.elapsed():7.1f} s] {message}", file=sys.stderr, flush=True)

    # -- the sized suite -------------------------------------------------------------------------
    def source(self, idx_dir: str | None = None) -> dict:
        """The data source on ``--data-dir`` (or on ``idx_dir``: a name for the data, for a
        fingerprint that does not depend on where the data lie)."""
        where = str(self.args.data_dir) if idx_dir is None else idx_dir
        init = {**self.base.sources[SOURCE]["init_args"], "idx_dir": where}
        if self.args.tiny:
            init.update(TINY["source"])
        return {"class_path": self.base.sources[SOURCE]["class_path"], "init_args": init}

    def common(self) -> dict:
        return {"trainer.accelerator": self.accelerator, "trainer.devices": 1}

    def prepare_name(self, epochs: int) -> str:
        return f"{AUTOENCODER}_{epochs}epochs"

    def prepare_set(self, epochs: int) -> dict:
        spec = self.base.prepare[AUTOENCODER]
        tiny = TINY[AUTOENCODER] if self.args.tiny else {}
        sized = {"trainer.max_epochs": epochs, "data.init_args.source": self.source()}
        return {**spec.set, **self.common(), **tiny, **sized}

    def suite(
        self, name: str, method: str, steps: int, epochs: int, idx_dir: str | None = None
    ) -> Suite:
        """The playbook's suite for one run: ``method`` as ``name`` with ``trainer.max_steps =
        steps`` on ``--data-dir`` (or ``idx_dir``, ``source``) and the ``--set`` values;
        DPSWflow-r with the autoencoder of ``epochs`` (the prepare step, named for its epochs),
        DP-Sinkhorn with no prepare step (none is part of its fingerprint)."""
        spec = self.base.methods[method]
        prepare = {}
        setters = dict(spec.set)
        if method == "dpswflow_r":
            prepare_name = self.prepare_name(epochs)
            base = self.base.prepare[AUTOENCODER]
            prepare[prepare_name] = PrepareSpec(prepare_name, base.config, self.prepare_set(epochs))
            setters = {
                key: value.replace(f"{{prepare[{AUTOENCODER}]}}", f"{{prepare[{prepare_name}]}}")
                if isinstance(value, str)
                else value
                for key, value in setters.items()
            }
        tiny = TINY[method] if self.args.tiny else {}
        sized = {"trainer.max_steps": steps, "trainer.max_epochs": -1}
        evaluation = {**self.base.evaluation, **(TINY["evaluation"] if self.args.tiny else {})}
        chosen = {**setters, **self.common(), **tiny, **dict(self.args.set), **sized}
        suite = dataclasses.replace(
            self.base,
            sources={SOURCE: self.source(idx_dir)},
            methods={name: MethodSpec(name, spec.config, chosen, (SOURCE,))},
            prepare=prepare,
            evaluation=evaluation,
        )
        weights = self.args.feature_extractor_weights_path
        return suite if weights is None else with_inception_weights(suite, weights)

    def frechet_key(self) -> str:
        """``fid`` with ``--feature_extractor_weights_path`` (Inception), else ``fd_classifier``."""
        return "fd_classifier" if self.args.feature_extractor_weights_path is None else "fid"

    # -- one run ---------------------------------------------------------------------------------
    def cell(self, method: str, steps: int, epochs: int) -> tuple[Suite, Cell, dict]:
        """The run's one-cell suite, its cell and its fingerprint."""
        name = f"{method}_{steps}steps"
        suite = self.suite(name, method, steps, epochs)
        cell = Cell(name, SOURCE, suite.epsilons[0], suite.seeds[0])
        return suite, cell, cell_fingerprint(suite, cell)

    def finished(self, method: str, steps: int, epochs: int) -> PlaybookRun | None:
        """The run in ``--out`` if a call with the same settings wrote it."""
        path = self.out / "runs" / f"{method}_{steps}steps.json"
        if not path.is_file():
            return None
        stored = json.loads(path.read_text())
        parts = self.cell(method, steps, epochs)[2]["parts"]
        if not digest_matches(stored.get("fingerprint"), parts):
            return None
        return PlaybookRun(**stored)

    def run(self, method: str, steps: int, epochs: int) -> PlaybookRun:
        """Train and score ``method`` for ``steps`` steps, or reuse its JSON in ``--out``."""
        suite, cell, fingerprint = self.cell(method, steps, epochs)
        digest = fingerprint["digest"]
        name, path = cell.method, self.out / "runs" / f"{cell.method}.json"
        stored = self.finished(method, steps, epochs)
        if stored is not None:
            self.log(f"{name}: finished before, reused ({path})")
            self.reused.append(name)
            self.runs[name] = stored
            return stored
        if method == "dpswflow_r":
            self.prepare(suite)
        self.log(f"{name}: training {steps} steps, target ε = {cell.epsilon:g}")
        timer = StepTimer()
        record = run_cell(suite, cell, self.work, callbacks=[timer])
        timed = bool(timer.seconds)  # a cell finished in --work-dir is read back, not timed
        step_seconds = timer.step_seconds() if timed else record["fit_seconds"] / record["steps"]
        setup_seconds = record["fit_seconds"] - sum(timer.seconds) if timed else 0.0
        return self.keep(method, steps, record, digest, step_seconds, setup_seconds)

    def keep(
        self,
        method: str,
        steps: int,
        record: dict,
        digest: str,
        step_seconds: float,
        setup_seconds: float,
        jobs: int | None = None,
    ) -> PlaybookRun:
        """Write a scored run's ``runs/<run>.json`` (its cell's ``record``, σ, step times) and
        ``samples/<run>.png`` in ``--out``."""
        name, cell_dir = record["method"], Path(record["report"]).parent
        report = json.loads(Path(record["report"]).read_text())["privacy"]
        result = PlaybookRun(
            run=name,
            method=method,
            method_class=record["method_class"],
            planned_steps=steps,
            steps=record["steps"],
            target_epsilon=record["target_epsilon"],
            privacy=record["privacy"],
            noise_multiplier=report.get("noise_multiplier"),
            epsilon_pld=report.get("epsilon_pld"),
            metrics=record["metrics"],
            step_seconds=step_seconds,
            setup_seconds=setup_seconds,
            fit_seconds=record["fit_seconds"],
            evaluate_seconds=record["evaluate_seconds"],
            device=self.device_name,
            torch=torch.__version__,
            tiny=self.args.tiny,
            fingerprint=digest,
            cell_dir=str(cell_dir),
            jobs=jobs,
        )
        self.write_samples(name, cell_dir / "samples.pt")
        write_json(self.out / "runs" / f"{name}.json", dataclasses.asdict(result))
        self.runs[name] = result
        epsilon = result.privacy["epsilon"]
        self.log(
            f"{name}: ε = {epsilon:.4g} ({result.privacy.get('accountant')}), "
            f"{1e3 * step_seconds:.1f} ms/step, fit {record['fit_seconds']:.1f} s, "
            f"evaluation {record['evaluate_seconds']:.1f} s, metrics {_short(record['metrics'])}"
        )
        return result

    def prepare(self, suite: Suite) -> None:
        (name,) = suite.prepare
        if not (self.work / "prepare" / name / "done.json").is_file():
            self.log(f"{name}: training the autoencoder on the public half")
        run_prepare(suite, name, self.work)

    def timing(self, run: PlaybookRun) -> Timing:
        return Timing(run.step_seconds, run.setup_seconds, run.evaluate_seconds)

    def time_autoencoder(self) -> dict:
        """Step time and batches per epoch of the autoencoder, from a few timed steps (public
        half only, nothing private; its model is thrown away)."""
        from lightning_dpot.training import run_lightning

        spec = self.base.prepare[AUTOENCODER]
        root = self.work / "timing" / AUTOENCODER
        values = {**self.prepare_set(1), "data.init_args.split_file": str(root / "split.json")}
        args = [
            "--config", str(spec.config),
            *self.base.overrides(values, self.base.values(root)),
            f"--trainer.max_steps={AUTOENCODER_PROBE_STEPS}",
            "--trainer.max_epochs=-1",
            "--trainer.callbacks=[]",
            "--trainer.enable_checkpointing=false",
            "--trainer.logger=false",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
            f"--trainer.default_root_dir={root}",
        ]  # fmt: skip
        start = time.perf_counter()
        cli = run_lightning(args, run=False)
        timer = StepTimer()
        cli.trainer.callbacks.append(timer)
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
        fit_seconds = time.perf_counter() - start
        return {
            "step_seconds": timer.step_seconds(),
            "setup_seconds": fit_seconds - sum(timer.seconds),
            "steps_per_epoch": int(cli.trainer.num_training_batches),
        }

    # -- plan ------------------------------------------------------------------------------------
    def settings(self) -> dict:
        """What the plan depends on; a second call with the same settings reuses it."""
        keys = ("budget_minutes", "probe_steps", "rungs", "ratio", "max_steps", "tiny")
        return {
            **{key: getattr(self.args, key) for key in keys},
            "data_dir": str(Path(self.args.data_dir).resolve()),
            "device": self.device_name,
            "suite": str(SUITE),
        }

    def caps(self) -> dict[str, int]:
        caps = dict(PAPER_STEPS)
        if self.args.max_steps is not None:
            caps = {m: min(c, self.args.max_steps) for m, c in caps.items()}
        return caps

    def plan(self) -> dict:
        """Measure (the probe runs and the autoencoder's steps) and plan, or reuse the plan a
        call with the same settings wrote. A method whose probe run failed, or that is left
        unmeasured because the budget is spent, gets no ladder (and the plan is not kept, so
        that the next call measures it again)."""
        path = self.out / "plan.json"
        if path.is_file():
            stored = json.loads(path.read_text())
            if stored.get("settings") == self.settings():
                self.log(f"plan reused ({path}): {stored['ladders']}")
                return stored
        probe = self.args.probe_steps
        measured: dict[str, Any] = {}
        dps = self.attempt("dp_sinkhorn", probe, epochs=1)  # needs no autoencoder
        if dps is not None:
            measured["dp_sinkhorn"] = dataclasses.asdict(self.timing(dps))
        epochs = 1
        autoencoder = None
        if self.left() > RESERVE_SHARE * self.budget:
            autoencoder = self.attempt_timing()
        else:  # measuring DPSWflow-r (autoencoder, first run) would overrun the budget
            self.log(f"dpswflow_r: not measured, {self.left():.0f} s left")
            self.skipped.append(
                {
                    "run": f"dpswflow_r_{probe}steps",
                    "predicted_seconds": None,
                    "seconds_left": self.left(),
                }
            )
        if autoencoder is not None:
            measured[AUTOENCODER] = autoencoder
            share = AUTOENCODER_SHARE * self.budget - autoencoder["setup_seconds"]
            epochs = autoencoder_epochs(
                share, autoencoder["steps_per_epoch"], autoencoder["step_seconds"]
            )
            self.log(
                f"autoencoder: {1e3 * autoencoder['step_seconds']:.1f} ms/step, "
                f"{autoencoder['steps_per_epoch']} steps/epoch: {epochs} epochs planned"
            )
            flow = self.attempt("dpswflow_r", probe, epochs)
            if flow is not None:
                measured["dpswflow_r"] = dataclasses.asdict(self.timing(flow))
        methods = [m for m in METHODS if m in measured]
        timings = {m: Timing(**measured[m]) for m in methods}
        reserve = RESERVE_SHARE * self.budget
        seconds = self.left() - reserve
        caps = self.caps()
        ladders = (
            allocate(seconds, timings, probe, caps, self.args.ratio, self.args.rungs)
            if methods
            else {}
        )
        plan = {
            "settings": self.settings(),
            "measured": measured,
            "autoencoder_epochs": epochs,
            "seconds_for_ladders": seconds,
            "reserve_seconds": reserve,
            "ladders": {m: [probe, *ladders[m]] for m in methods},
            "predicted_seconds": {m: ladder_seconds(timings[m], ladders[m]) for m in methods},
            "caps": caps,
        }
        if len(methods) == len(METHODS):
            write_json(path, plan)
        for m in methods:
            self.log(
                f"plan {m}: {1e3 * timings[m].step_seconds:.1f} ms/step, set-up "
                f"{timings[m].setup_seconds:.1f} s, evaluation {timings[m].evaluate_seconds:.1f} s "
                f"-> steps {plan['ladders'][m]} (predicted {plan['predicted_seconds'][m]:.0f} s, "
                f"cap {caps[m]:,})"
            )
        self.log(f"plan: {seconds:.0f} s for the ladders, {reserve:.0f} s kept in reserve")
        return plan

    def attempt(self, method: str, steps: int, epochs: int) -> PlaybookRun | None:
        """``run``, or ``None`` if it failed: the failure is logged, its traceback written
        to ``errors/<run>.txt`` and listed in the summary, and the other runs go on (a short
        loan should not lose every result to one run)."""
        try:
            return self.run(method, steps, epochs)
        except Exception as err:  # recorded; the exit status is 1
            self.fail(f"{method}_{steps}steps", err)
            return None

    def attempt_timing(self) -> dict | None:
        try:
            return self.time_autoencoder()
        except Exception as err:  # recorded; the exit status is 1
            self.fail(f"{AUTOENCODER}_timing", err)
            return None

    def fail(self, name: str, err: Exception) -> None:
        failure = record_failure(name, err, self.out / "errors")
        self.failed.append(dataclasses.asdict(failure))
        self.log(f"{name}: FAILED ({failure.error}); see {self.out / 'errors' / name}.txt")

    # -- everything ------------------------------------------------------------------------------
    def execute(self) -> dict:
        """Plan, run the ladders shortest first (each run only if its predicted cost fits the
        time left, less half the reserve), and write the results after every run."""
        plan = self.plan()
        epochs = plan["autoencoder_epochs"]
        timings = {m: Timing(**plan["measured"][m]) for m in plan["ladders"]}
        queue = sorted(
            ((m, t) for m in plan["ladders"] for t in plan["ladders"][m]),
            key=lambda run: timings[run[0]].predict(run[1]),
        )
        self.write_results(plan, finished=False)
        for method, steps in queue:
            name = f"{method}_{steps}steps"
            if name in self.runs or any(f["run"] == name for f in self.failed):
                continue
            predicted = timings[method].predict(steps)
            fits = predicted <= self.left() - 0.5 * RESERVE_SHARE * self.budget
            if not fits and self.finished(method, steps, epochs) is None:
                self.log(f"{name}: skipped, predicted {predicted:.0f} s, {self.left():.0f} s left")
                self.skipped.append(
                    {"run": name, "predicted_seconds": predicted, "seconds_left": self.left()}
                )
                continue
            self.attempt(method, steps, epochs)
            self.write_results(plan, finished=False)
        summary = self.write_results(plan, finished=True)
        self.log(f"done in {summary['wall_seconds']:.0f} s of {self.budget:.0f} s: {self.out}")
        return summary

    def write_results(self, plan: dict, finished: bool) -> dict:
        """``summary.json``, ``results.md`` and ``accuracy_vs_steps.png`` as they stand (written
        after every run, so that a call stopped at its deadline leaves them)."""
        runs = sorted(self.runs.values(), key=lambda r: (METHODS.index(r.method), r.steps))
        return self.write_summary(
            runs,
            finished,
            budget_minutes=self.args.budget_minutes,
            plan=plan,
            step_seconds={m: t["step_seconds"] for m, t in plan["measured"].items()},
            reused_runs=sorted(self.reused),
            skipped_runs=self.skipped,
            failed_runs=self.failed,
            wall_seconds=round(self.elapsed(), 1),
            within_budget=self.elapsed() <= self.budget,
        )

    def write_summary(self, runs: list[PlaybookRun], finished: bool, **facts: Any) -> dict:
        """The one writer of ``summary.json`` (the machine, the target, the ``runs``, the
        published numbers and the call's ``facts``), ``results.md`` and
        ``accuracy_vs_steps.png`` in ``--out``."""
        epsilon = self.base.epsilons[0]
        summary = {
            "suite": str(SUITE.relative_to(REPO)),
            "device": self.device_name,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "lightning": L.__version__,
            "python": platform.python_version(),
            "target": {"epsilon": epsilon, "delta": self.base.delta},
            "num_samples": self.suite("", "dp_sinkhorn", 1, 1).evaluation["num_samples"],
            "frechet": self.frechet_key(),
            "finished": finished,
            "tiny": self.args.tiny,
            **facts,
            "runs": [dataclasses.asdict(run) for run in runs],
            "published": [dataclasses.asdict(entry) for entry in PUBLISHED.values()],
        }
        (self.out / "results.md").write_text(markdown(summary))
        points = [run_point(dataclasses.asdict(run), self.device_name) for run in runs]
        published = tuple(PUBLISHED.values())
        plot_against_steps(points, published, self.out / "accuracy_vs_steps.png", epsilon)
        write_json(self.out / "summary.json", summary)
        return summary

    # -- one private run across time-limited jobs -------------------------------------------------
    def single_cell(self) -> tuple[Suite, Cell, dict]:
        """``--single-run``'s one-cell suite, its cell and its fingerprint, in which the data
        are named by their contents (``data_digest``), not by where this job finds them."""
        method, steps = self.args.single_run, self.args.steps
        name = f"{method}_{steps}steps"
        suite = self.suite(name, method, steps, 1)
        cell = Cell(name, SOURCE, suite.epsilons[0], suite.seeds[0])
        named = f"sha256:{data_digest(Path(self.args.data_dir))}"
        return suite, cell, cell_fingerprint(self.suite(name, method, steps, 1, named), cell)

    def claim(self, cell: Cell, fingerprint: dict) -> dict:
        """``run.json``: what the run in ``--state`` is, written by its first job. A later job
        asking for another run (another length, other settings or data) is refused."""
        path = self.work / "run.json"
        wanted = {
            "run": cell.method,
            "method": self.args.single_run,
            "planned_steps": self.args.steps,
            "target_epsilon": cell.epsilon,
            "delta": self.base.delta,
            "tiny": self.args.tiny,
            "set": dict(self.args.set),
            "fingerprint": fingerprint,
        }
        if not path.is_file():
            write_json(path, wanted)
            return wanted
        stored = json.loads(path.read_text())
        if digest_matches(stored["fingerprint"]["digest"], fingerprint["parts"]):
            return stored
        if stored["planned_steps"] != self.args.steps:
            raise refuse(
                f"--steps {self.args.steps} but the run in {self.work} is planned for "
                f"{stored['planned_steps']} steps (σ was calibrated once, for them): a job never "
                f"changes its run's plan. Continue it with --steps {stored['planned_steps']}, or "
                "start another private run in a new --state folder"
            )
        old, new = stored["fingerprint"]["parts"], fingerprint["parts"]
        changed = [key for key in new if key != "overrides" and old.get(key) != new[key]]
        before, now = set(old.get("overrides", [])), set(new["overrides"])
        changed += sorted({arg.split("=", 1)[0].lstrip("-") for arg in before ^ now})
        raise refuse(
            f"the run in {self.work} was started with other settings ({', '.join(changed)} "
            "differ; data are named by their contents): a job never changes its run's plan. "
            "Continue it with the settings in its run.json, or start another private run in a "
            "new --state folder"
        )

    def job(self) -> dict:
        """One job of ``--single-run``: continue the run in ``--state`` until the job's time is
        nearly up, write ``progress.json``, and score the run once it reaches its length."""
        suite, cell, fingerprint = self.single_cell()
        self.claim(cell, fingerprint)
        steps, state = self.args.steps, self.work
        progress_path = state / "progress.json"
        before = json.loads(progress_path.read_text()) if progress_path.is_file() else {}
        record_path = state / "cells" / cell.key / "cell.json"
        if record_path.is_file():
            record = json.loads(record_path.read_text())
            result = self.keep_single(record, before, fingerprint)
            self.say(
                f"{cell.method}: finished before, {record['steps']:,} steps in "
                f"{before.get('jobs')} jobs, ε = {record['privacy']['epsilon']:.4g}: nothing "
                f"left to do; results in {self.out}"
            )
            return {**before, "result": result, "failed_runs": []}
        deadline = None
        if self.args.job_minutes is not None:
            deadline = self.start + 60.0 * (self.args.job_minutes - self.args.margin_minutes)
        checkpoint = state / "cells" / cell.key / "checkpoints" / "last.ckpt"
        clock = JobClock(
            checkpoint, deadline, self.args.job_steps, 60.0 * self.args.checkpoint_minutes
        )
        timer = StepTimer()
        jobs = int(before.get("jobs", 0)) + 1
        self.log(f"{cell.method}: job {jobs}, {steps:,} steps planned, state {state}")
        if before.get("state", str(state)) != str(state):
            self.log(
                f"{cell.method}: the state folder moved from {before['state']} to {state}: the "
                "run continues from its checkpoint and release journal here (the accountant "
                "checks the journal against the checkpoint)"
            )
        trained = train_cell(
            suite,
            cell,
            state,
            callbacks=[TrainingRngStream(), clock, timer],
            fingerprint=fingerprint,
            args=["--trainer.enable_checkpointing=false"],
        )
        report = json.loads((trained.cell_dir / "report.json").read_text())["privacy"]
        done = int(trained.cli.trainer.global_step)
        stopped = bool(report.get("stopped_by_budget"))
        progress = {
            "run": cell.method,
            "method": self.args.single_run,
            "planned_steps": steps,
            "steps_done": done,
            "steps_left": max(0, steps - done),
            "finished": done >= steps or stopped,
            "epsilon": report.get("epsilon"),
            "delta": report.get("delta"),
            "target_epsilon": cell.epsilon,
            "accountant": report.get("accountant"),
            "releases": report.get("releases"),
            "noise_multiplier": report.get("noise_multiplier"),
            "stopped_by_budget": stopped,
            "jobs": jobs,
            "fit_seconds": round(float(before.get("fit_seconds", 0.0)) + trained.fit_seconds, 2),
            "step_seconds": timer.step_seconds() if timer.seconds else before.get("step_seconds"),
            "last_job": {
                "steps": clock.steps,
                "ended_by": clock.ended_by or "no step left",
                "seconds": round(self.elapsed(), 1),
                "device": self.device_name,
            },
            "state": str(state),
            "checkpoint": str(checkpoint.relative_to(state)),
            "journal": _inside(report.get("journal"), state),
        }
        write_json(progress_path, progress)
        epsilon, sigma = progress["epsilon"], progress["noise_multiplier"]
        so_far = f"ε = {epsilon:.4g} so far ({progress['accountant']}), σ = {sigma:.4g}"
        if not progress["finished"]:
            more = math.ceil(progress["steps_left"] / max(clock.steps, 1))
            self.say(
                f"{cell.method}: {done:,} of {steps:,} steps after job {jobs}, {so_far}; "
                f"{progress['steps_left']:,} steps left (about {more} more jobs like this one): "
                "run again to continue (the same command, with this --state)"
            )
            return {**progress, "failed_runs": []}
        if stopped:
            self.log(f"{cell.method}: the accountant ended the run at {done:,} steps")
        self.log(f"{cell.method}: {done:,} steps, {so_far}; evaluating")
        record = score_cell(suite, cell, state, trained)
        result = self.keep_single(record, progress, fingerprint)
        self.say(
            f"{cell.method}: finished, {done:,} steps in {jobs} jobs, ε = {epsilon:.4g}; "
            f"{_short(record['metrics'])}; results in {self.out}"
        )
        return {**progress, "result": result, "failed_runs": []}

    def keep_single(self, record: dict, progress: dict, fingerprint: dict) -> dict:
        """The scored run's JSON, samples and ``summary.json`` / ``results.md`` in ``--out``;
        the run as a mapping. Its fit time is the sum over its jobs."""
        fit_seconds = progress.get("fit_seconds", record["fit_seconds"])
        step_seconds = progress.get("step_seconds") or fit_seconds / max(record["steps"], 1)
        result = self.keep(
            self.args.single_run,
            self.args.steps,
            {**record, "fit_seconds": fit_seconds},
            fingerprint["digest"],
            step_seconds,
            0.0,
            jobs=progress.get("jobs"),
        )
        self.write_summary(
            [result], True, budget_minutes=None, single_run=progress, reused_runs=[],
            skipped_runs=[], failed_runs=[],
        )  # fmt: skip
        return dataclasses.asdict(result)

    def say(self, line: str) -> None:
        """A job's last line: logged, and on stdout for the cluster's job log."""
        self.log(line)
        print(line, flush=True)

    def write_samples(self, name: str, samples: Path) -> None:
        """The run's sample grid (10 per row) as ``samples/<run>.png``."""
        from torchvision.utils import save_image

        grid = images_to_grid(torch.load(samples), nrow=10)
        save_image(grid, self.out / "samples" / f"{name}.png")


# -- outputs -------------------------------------------------------------------------------------
def _inside(path: str | None, folder: Path) -> str | None:
    """``path`` relative to ``folder`` when it lies in it (a state folder moves)."""
    if path is None:
        return None
    try:
        return str(Path(path).relative_to(folder))
    except ValueError:
        return path


def _short(metrics: dict) -> str:
    parts = [f"FD {metrics['fd_classifier']:.1f}"] if "fd_classifier" in metrics else []
    parts += [f"FID {metrics['fid']:.1f}"] if "fid" in metrics else []
    for name, accuracy in (metrics.get("utility") or {}).items():
        parts.append(f"{name} {accuracy:.3f}")
    return ", ".join(parts)


def _cell(value: float | None, digits: str = ".3f") -> str:
    return "—" if value is None else format(value, digits)


def markdown(summary: dict) -> str:
    """The results table, one row per run, and the published numbers beside it."""
    minutes, single = summary["budget_minutes"], summary.get("single_run")
    budget = f"budget {minutes:g} min" if single is None else f"{single['jobs']} jobs"
    key = summary.get("frechet", "fd_classifier")
    frechet = (
        "FID: InceptionV3 features (the torch-fidelity weights file), as the papers, but on "
        "fewer samples (FID is biased upward at small N). "
        if key == "fid"
        else "FD: Fréchet distance on the project classifier's features (not FID). "
    )
    lines = [
        "# GPU playbook: DP-Sinkhorn and DPSWflow-r on Fashion-MNIST",
        "",
        f"Target (ε, δ) = ({summary['target']['epsilon']:g}, {summary['target']['delta']:g}), "
        f"central DP; device {summary['device']}, torch {summary['torch']}; {budget}. Every "
        "run is one private run with σ calibrated for its own length (once, however many jobs "
        "it took); ε is its accountant's. "
        + frechet
        + f"Accuracy: LogReg / MLP / CNN trained on {summary['num_samples']:,} labelled samples "
        "(full protocol of Cao et al. 2021, App. D.2), tested on the real test images; "
        "DPSWflow-r is unconditional (no labels, no accuracy).",
        "",
        length_table(run_point(run, summary["device"]) for run in summary["runs"]).rstrip(),
    ]
    published = tuple(PublishedResult(**entry) for entry in summary["published"])
    lines += ["", *published_table(published, (), longest_runs(summary))]
    lengths = ", ".join(f"{e.method} {e.steps:,}" for e in published if e.steps is not None)
    lines.append(f"This suite: the longest run of each method. Published steps: {lengths}.")
    if summary["skipped_runs"]:
        names = ", ".join(s["run"] for s in summary["skipped_runs"])
        lines += ["", f"Skipped (predicted cost above the time left): {names}."]
    for failure in summary["failed_runs"]:
        lines += [
            "",
            f"Failed: {failure['run']}: {failure['error']} (errors/{failure['run']}.txt).",
        ]
    return "\n".join(lines) + "\n"


def longest_runs(summary: dict) -> list[dict]:
    """The longest run of each method as the rows ``published_table`` reads (every metric a
    (value, spread) pair: one run, no spread)."""
    epsilon, rows = summary["target"]["epsilon"], {}
    for run in sorted(summary["runs"], key=lambda r: r["steps"]):
        point = run_point(run, summary["device"])
        rows[point.method] = {
            "method": point.method,
            "target_epsilon": epsilon,
            "metrics": {k: (v, None) for k, v in point.metrics.items()},
        }
    return list(rows.values())


# -- command line --------------------------------------------------------------------------------
def _number(name: str, low: float, kind: type = float, above: bool = True):
    """An argparse type: a ``kind`` number > ``low`` (or ≥ with ``above=False``)."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if (
            value is None
            or not math.isfinite(value)
            or not (value > low if above else value >= low)
        ):
            bound = f"> {low:g}" if above else f">= {low:g}"
            raise argparse.ArgumentTypeError(
                f"{name} must be a{'n integer' if kind is int else ' finite number'} {bound}, "
                f"got {text!r}"
            )
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--data-dir",
        required=True,
        help="folder with the four Fashion-MNIST IDX files (.gz or not)",
    )
    parser.add_argument(
        "--budget-minutes", type=_number("--budget-minutes", 0), default=40.0,
        help="everything (measuring, the autoencoder, training, evaluation) ends within this",
    )  # fmt: skip
    parser.add_argument(
        "--out", default=None,
        help="results folder (default docs/results/gpu_playbook; with --single-run STATE/results)",
    )  # fmt: skip
    parser.add_argument(
        "--work-dir", default=None,
        help="checkpoints, caches and run directories (large; not results; default "
        "runs/gpu_playbook; not with --single-run, whose run lives in --state)",
    )  # fmt: skip
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument(
        "--probe-steps", type=_number("--probe-steps", 1, int, above=False), default=50,
        help="length of the first, timed run of each method",
    )  # fmt: skip
    parser.add_argument(
        "--rungs", type=_number("--rungs", 1, int, above=False), default=3,
        help="most runs per method above the probe run",
    )  # fmt: skip
    parser.add_argument(
        "--ratio", type=_number("--ratio", 1), default=4.0,
        help="ratio of consecutive run lengths",
    )  # fmt: skip
    parser.add_argument(
        "--max-steps", type=_number("--max-steps", 1, int, above=False), default=None,
        help="cap every run at this many steps (below the papers' budgets)",
    )  # fmt: skip
    parser.add_argument(
        "--tiny", action="store_true",
        help="small models and batches: a CPU check of the whole path, numbers meaningless",
    )  # fmt: skip
    parser.add_argument(
        "--feature_extractor_weights_path", default=None,
        help="local InceptionV3 FID weights (docs/evaluation.md): FID beside the published FIDs "
        "instead of the classifier FD",
    )  # fmt: skip
    single = parser.add_argument_group(
        "one private run across time-limited jobs (each call is one job; module docstring)"
    )
    single.add_argument(
        "--single-run", choices=SINGLE_RUN_METHODS, default=None,
        help="continue one run of this method in --state instead of the ladders",
    )  # fmt: skip
    single.add_argument(
        "--steps", type=_number("--steps", 1, int, above=False), default=None,
        help="the run's planned length (σ is calibrated for it once; default the paper's: "
        f"{PAPER_STEPS['dp_sinkhorn']:,} for dp_sinkhorn)",
    )  # fmt: skip
    single.add_argument(
        "--state", default=None,
        help="the run's folder (checkpoint, release journal, run.json, progress.json): give "
        "each job the folder the previous job left",
    )  # fmt: skip
    single.add_argument(
        "--job-minutes", type=_number("--job-minutes", 0), default=None,
        help="this job's time limit, counted from the script's start (default: none)",
    )  # fmt: skip
    single.add_argument(
        "--margin-minutes", type=_number("--margin-minutes", 0, above=False), default=5.0,
        help="training ends this long before --job-minutes (the checkpoint, the reports)",
    )  # fmt: skip
    single.add_argument(
        "--checkpoint-minutes", type=_number("--checkpoint-minutes", 0), default=10.0,
        help="also write the checkpoint this often (what a job killed without notice repeats)",
    )  # fmt: skip
    single.add_argument(
        "--job-steps", type=_number("--job-steps", 1, int, above=False), default=None,
        help="at most this many steps in this job",
    )  # fmt: skip
    single.add_argument(
        "--set", action="append", type=_setting, default=[], metavar="KEY=VALUE",
        help="a config value of the run (part of its plan, e.g. model.init_args.noise_seed=0 "
        "for a test); repeatable",
    )  # fmt: skip
    return parser


def _setting(text: str) -> tuple[str, str]:
    """``--set KEY=VALUE`` as ``(KEY, VALUE)``; the run's length is ``--steps``'s."""
    key, equals, value = text.partition("=")
    if not equals or not key:
        raise argparse.ArgumentTypeError(f"--set takes KEY=VALUE, got {text!r}")
    if key in ("trainer.max_steps", "trainer.max_epochs"):
        raise argparse.ArgumentTypeError(f"--set {key}: the run's length is --steps")
    return key, value


def check_single_run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The options of ``--single-run`` go with it, and its run lives in ``--state``; fills in
    the defaults that depend on the mode."""
    if args.single_run is None:
        given = [
            name
            for name in ("steps", "state", "job_minutes", "job_steps")
            if getattr(args, name) is not None
        ] + (["set"] if args.set else [])
        if given:
            options = ", ".join(f"--{name.replace('_', '-')}" for name in given)
            parser.error(f"{options} go with --single-run")
        args.out = args.out or "docs/results/gpu_playbook"
        args.work_dir = args.work_dir or "runs/gpu_playbook"
        return
    if args.state is None:
        parser.error("--single-run needs --state, the run's folder (the same for every job)")
    if args.work_dir is not None:
        parser.error("--work-dir does not go with --single-run: the run lives in --state")
    if args.job_minutes is not None and args.margin_minutes >= args.job_minutes:
        parser.error(
            f"--margin-minutes ({args.margin_minutes:g}) must be below --job-minutes "
            f"({args.job_minutes:g}): no time would be left to train"
        )
    args.steps = args.steps or PAPER_STEPS[args.single_run]
    args.out = args.out or str(Path(args.state) / "results")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    folder = Path(args.data_dir)
    missing = [
        name
        for names in IDX_FILES.values()
        for name in names
        if not folder.is_dir() or find_idx_file(folder, name) is None
    ]
    if missing:
        parser.error(f"--data-dir={args.data_dir!r} lacks {', '.join(missing)} (or the .gz)")
    check_single_run(parser, args)
    if args.max_steps is not None and args.max_steps < 2 * args.probe_steps:
        parser.error(
            f"--max-steps must be >= 2 × --probe-steps = {2 * args.probe_steps} (the ladder "
            f"starts above the probe run), got {args.max_steps}"
        )
    if args.feature_extractor_weights_path is not None:
        try:  # the FID network is built once now, not after the first run has trained
            path = check_inception_weights(args.feature_extractor_weights_path)
        except (FileNotFoundError, ModuleNotFoundError, ValueError) as error:
            parser.error(f"--feature_extractor_weights_path: {error}")
        args.feature_extractor_weights_path = path
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    elif args.device == "cuda" and not torch.cuda.is_available():
        parser.error(
            "--device=cuda: no CUDA device is visible (torch.cuda.is_available() is False)"
        )
    return args


def main(argv: list[str] | None = None, started: float | None = None) -> dict:
    """Run the playbook (``argv``: the command line); ``started``: when the budget's clock
    started (default now). Returns the summary written to ``--out/summary.json``."""
    # dp-accounting logs every RDP order it cannot evaluate (harmless: that order is left out).
    logging.getLogger("absl").setLevel(logging.ERROR)
    args = parse_args(argv)
    playbook = Playbook(args, started)
    return playbook.job() if args.single_run else playbook.execute()


if __name__ == "__main__":
    sys.exit(1 if main(started=STARTED)["failed_runs"] else 0)
