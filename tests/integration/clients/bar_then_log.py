"""A tqdm bar on stderr that a log line interrupts, as a Trainer's logger does.

Rank 0 redraws ``train: NN%|###| i/10`` ten times, 0.15 s apart, waits until ``./go`` exists
(a test creates it once it has seen the bar's last state; at most 60 s), then writes
``saving checkpoint`` on stderr with no newline before it (glued to the bar in the raw bytes),
redraws the bar once more and ends it with a newline.
"""

import sys
import time
from pathlib import Path

from tqdm import tqdm

bar = tqdm(total=10, file=sys.stderr, desc="train", ascii=True, mininterval=0, miniters=1,
           bar_format="{desc}: {percentage:3.0f}%|{bar:10}| {n}/{total}")  # fmt: skip
for _ in range(10):
    time.sleep(0.15)
    bar.update(1)
deadline = time.monotonic() + 60
while not Path("go").exists() and time.monotonic() < deadline:
    time.sleep(0.05)
sys.stderr.write("saving checkpoint\n")
sys.stderr.flush()
time.sleep(0.5)
bar.close()
print("done", flush=True)
