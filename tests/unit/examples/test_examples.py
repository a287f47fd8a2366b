"""examples/: the GPT model, the stdlib character corpus, and the README's first job."""

import math

import pytest
import torch

from examples.data import VOCAB, CharDataset, decode, encode, stdlib_text
from examples.gpt import GPT, GPTConfig, count_parameters

SMALL = GPTConfig(vocab_size=len(VOCAB), n_layer=2, n_head=4, d_model=64, seq_len=32)


def test_parameter_count_is_exact():
    for tie in (True, False):
        config = GPTConfig(len(VOCAB), n_layer=2, n_head=4, d_model=64, seq_len=32, tie_weights=tie)
        model = GPT(config)
        assert sum(p.numel() for p in model.parameters()) == count_parameters(config)
    # 12*2*64^2 + 13*2*64 + 32*64 + 2*64 + 97*64
    assert count_parameters(SMALL) == 98304 + 1664 + 2048 + 128 + 6208 == 108352
    bench = GPTConfig(vocab_size=8192, n_layer=6, n_head=8, d_model=512, seq_len=128)
    assert count_parameters(bench) == 23_175_168
    assert sum(p.numel() for p in GPT(bench).parameters()) == 23_175_168


def test_forward_shapes_loss_and_tied_head():
    torch.manual_seed(0)
    model = GPT(SMALL)
    assert model.head.weight is model.tok_emb.weight
    idx = torch.randint(0, SMALL.vocab_size, (3, 32))
    targets = torch.randint(0, SMALL.vocab_size, (3, 32))
    logits, loss = model(idx, targets)
    assert logits.shape == (3, 32, SMALL.vocab_size)
    assert torch.isfinite(loss) and abs(loss.item() - math.log(SMALL.vocab_size)) < 0.3
    logits2, none = model(idx[:, :5])
    assert none is None and logits2.shape == (3, 5, SMALL.vocab_size)
    # causal: the first 5 positions do not see the rest
    assert torch.allclose(logits2, logits[:, :5], atol=1e-5)
    with pytest.raises(ValueError, match="longer than GPTConfig.seq_len 32"):
        model(torch.zeros(1, 33, dtype=torch.long))


def test_init_is_deterministic_from_torch_seed():
    torch.manual_seed(7)
    a = GPT(SMALL).state_dict()
    torch.manual_seed(7)
    b = GPT(SMALL).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(ValueError, match="divisible by n_head"):
        GPTConfig(vocab_size=10, n_layer=1, n_head=3, d_model=64, seq_len=8)


def test_corpus_vocab_and_windows():
    assert len(VOCAB) == 97 and len(set(VOCAB)) == 97
    assert decode(encode("def f(x):\n\treturn x")) == "def f(x):\n\treturn x"
    assert decode(encode("é")) == "?"
    text = stdlib_text(50_000)
    assert len(text) == 50_000 and text == stdlib_text(50_000)
    data = CharDataset(32, max_chars=50_000)
    val = CharDataset(32, max_chars=50_000, split="val")
    assert len(data) == (45_000 - 1) // 32 and len(val) == (5_000 - 1) // 32
    x, y = data[3]
    assert x.shape == y.shape == (32,) and x.dtype == torch.long
    assert torch.equal(x[1:], y[:-1])
    assert data[4][0][0] == y[-1]  # windows tile the text
    assert decode(data[0][0]) == text[:32]
    with pytest.raises(IndexError):
        data[len(data)]


def test_a_few_steps_reduce_the_loss():
    torch.manual_seed(0)
    model = GPT(SMALL)
    data = CharDataset(32, max_chars=50_000)
    x = torch.stack([data[i][0] for i in range(8)])
    y = torch.stack([data[i][1] for i in range(8)])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(15):
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 1.0
