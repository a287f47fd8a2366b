"""A plain accelerate training script, as its docs show it: ``Accelerator()``, prepare, a few steps.

On a machine without GPUs, accelerate forms a process group only with ``cpu=True`` or
``ACCELERATE_USE_CPU=1``; without either, every rank of a multi-rank launch trains alone.
Each rank prints ``processes N loss <float.hex()>`` at the end.
"""

from __future__ import annotations

import torch
from accelerate import Accelerator


def main() -> None:
    accelerator = Accelerator()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    data = torch.Generator().manual_seed(accelerator.process_index)
    for _ in range(3):
        x = torch.randn(4, 8, generator=data)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        accelerator.backward(loss)
        optimizer.step()
    print(f"processes {accelerator.num_processes} loss {loss.item().hex()}", flush=True)


if __name__ == "__main__":
    main()
