"""Train a small PtychoNN-like surrogate with DDP on solar batches.

    mpiexec -n 4 python examples/train_surrogate.py --data .demo/ptychonn.h5 --epochs 5
    mpiexec -n 4 python examples/train_surrogate.py --data .demo/ptychonn.h5 --epochs 5 --resume
    torchrun --nproc_per_node 4 examples/train_surrogate.py --data .demo/ptychonn.h5 --epochs 5
    srun -n 4 python examples/train_surrogate.py --data .demo/ptychonn.h5 --epochs 5

The script is the same under every launcher (``solar.dist.init`` finds out which one started it).

A 256×256 diffraction image goes through a convolutional encoder and two decoders to 64×64
amplitude and phase. Local batches may differ in size (slack > 0): the loss is the *sum* of
per-sample losses scaled by ``solar.dist.scale_loss``, so DDP's average is the gradient of the
global mean. Rank 0 logs loss, samples/s, stall time and hit rate per epoch, and writes a
checkpoint (model, optimizer, every rank's loader state) at each epoch end and every
``--checkpoint-every`` steps; ``--resume`` continues from it exactly.

Each sample is prepared by ``prepare`` on solar's transform workers, off the training thread:
the image log-normalised, and image and targets flipped together at random. Its generator is
the sample's own (seed, epoch, sample), so a resumed run sees the same flips.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from solar import Loader, PlanningConfig, dist
from solar.io.generate import generate


class Surrogate(nn.Module):
    """Encoder 256² → 32×32×32, two decoders → 64² amplitude and phase."""

    def __init__(self) -> None:
        super().__init__()

        def down(i: int, o: int) -> nn.Module:
            return nn.Sequential(nn.Conv2d(i, o, 3, stride=2, padding=1), nn.ReLU())

        def decoder() -> nn.Module:
            return nn.Sequential(
                nn.ConvTranspose2d(32, 16, 4, stride=2, padding=1), nn.ReLU(),
                nn.Conv2d(16, 1, 3, padding=1),
            )  # fmt: skip

        self.encoder = nn.Sequential(down(1, 8), down(8, 16), down(16, 32))
        self.amplitude, self.phase = decoder(), decoder()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.encoder(x[:, None])
        return self.amplitude(z)[:, 0], self.phase(z)[:, 0]


def prepare(sample: dict[str, np.ndarray], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Log-normalise the diffraction image; flip image and targets left-right at random."""
    x = np.log1p(np.abs(sample["diffraction"]))
    out = {"diffraction": (x - x.mean()) / (x.std() + 1e-6),
           "amplitude": sample["amplitude"], "phase": sample["phase"]}  # fmt: skip
    if rng.random() < 0.5:
        out = {k: v[:, ::-1] for k, v in out.items()}
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


def per_sample_loss(model: nn.Module, batch: dict) -> torch.Tensor:
    amp, phase = model(batch["diffraction"])
    err = (amp - batch["amplitude"]) ** 2 + (phase - batch["phase"]) ** 2
    return err.mean(dim=(1, 2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path(".demo/ptychonn.h5"))
    parser.add_argument("--samples", type=int, default=1024, help="generated if --data is absent")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument(
        "--buffer", default="50%", help="samples or bytes per rank, or %% of data over all ranks"
    )
    parser.add_argument("--slack", type=float, default=0.25)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", type=Path, default=Path("checkpoint.pt"))
    parser.add_argument("--checkpoint-every", type=int, default=0, help="steps; 0: epochs only")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--keep-checkpoints", action="store_true",
                        help="keep each checkpoint as CHECKPOINT.stepN too")  # fmt: skip
    opts = parser.parse_args()

    d = dist.init()
    if d.is_root:
        print(f"training on {d.world_size} ranks ({d.launcher})", flush=True)
    if d.is_root and not opts.data.exists():
        opts.data.parent.mkdir(parents=True, exist_ok=True)
        generate(opts.data, "ptychonn", opts.samples)
    d.comm.Barrier()
    # Planner snapshots beside the checkpoint: a resume replans from the last epoch boundary.
    snapshots = opts.checkpoint.with_name(opts.checkpoint.name + ".planner")
    snapshots.mkdir(parents=True, exist_ok=True)
    loader = Loader(opts.data, batch_size=opts.batch_size, epochs=opts.epochs, buffer=opts.buffer,
                    seed=opts.seed, comm=d.comm, transform=prepare,
                    planning=PlanningConfig(slack=opts.slack, snapshots=snapshots))  # fmt: skip

    torch.manual_seed(opts.seed)
    model = DDP(Surrogate())
    optimizer = torch.optim.Adam(model.parameters(), lr=opts.lr)
    start_epoch = 0
    if opts.resume:
        ckpt = torch.load(opts.checkpoint, weights_only=False)
        model.module.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        loader.load_state_dict(ckpt["loaders"][d.rank])
        start_epoch = ckpt["loaders"][d.rank]["epoch"]
        if d.is_root:
            print(f"resumed from {opts.checkpoint} at global step {ckpt['step']}", flush=True)

    def save(step: int) -> None:
        states = d.comm.gather(loader.state_dict(), root=0)
        if d.is_root:
            tmp = opts.checkpoint.with_name(opts.checkpoint.name + ".tmp")
            ckpt = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                    "loaders": states, "step": step}  # fmt: skip
            torch.save(ckpt, tmp)
            os.replace(tmp, opts.checkpoint)
            if opts.keep_checkpoints:
                shutil.copyfile(opts.checkpoint, f"{opts.checkpoint}.step{step}")

    for epoch in range(start_epoch, opts.epochs):
        loader.set_epoch(epoch)
        t0 = time.perf_counter()
        loss_total, seen = 0.0, 0
        for batch in loader:
            optimizer.zero_grad()
            losses = per_sample_loss(model, batch)
            dist.scale_loss(losses.sum(), loader).backward()
            optimizer.step()
            loss_total += float(losses.sum().detach())
            seen += len(losses)
            step = loader.state_dict()["next_step"]
            if opts.checkpoint_every and step % opts.checkpoint_every == 0:
                save(step)
        seconds = time.perf_counter() - t0
        st = loader.stats.epochs[epoch]
        totals = np.array([loss_total, seen, st.hits, st.samples], float)
        loss_total, seen, hits, samples = dist.allreduce(d.comm, totals).tolist()
        stall = dist.allreduce(d.comm, st.stall_seconds, dist.MAX)
        save(loader.state_dict()["next_step"])
        if d.is_root:
            print(
                f"epoch {epoch}: loss {loss_total / seen:.5f}  {samples / seconds:.0f} samples/s  "
                f"stall {stall:.2f} s  hit rate {100 * hits / samples:.1f} %",
                flush=True,
            )
    if d.is_root:
        digest = sum(float(p.detach().double().sum()) for p in model.module.parameters())
        print(f"done: parameter checksum {digest:.12e}", flush=True)


if __name__ == "__main__":
    main()
