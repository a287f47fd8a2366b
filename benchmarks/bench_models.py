"""The benchmark's models, all trained as ``loss = model(inputs, targets)`` on the same tokens.

* ``gpt``: the repository's own GPT (``examples/gpt.py``);
* ``torch_encoder``: a causal language model whose body is torch's own
  ``nn.TransformerEncoderLayer`` stack (its attention reads ``out_proj.weight`` without calling
  ``out_proj``, the pattern stage 3 must fetch on access);
* ``hf_llama``: Hugging Face's ``LlamaForCausalLM`` built from a config (no download).

Each is sized by the same ``ModelShape`` (layers, width, heads, vocabulary rows), so at the
default shape all three have 23-28M parameters.
"""

from __future__ import annotations

import torch

__all__ = ["MODELS", "build"]

MODELS = ("gpt", "torch_encoder", "hf_llama")


class _TorchEncoderLM(torch.nn.Module):
    def __init__(self, shape):
        super().__init__()
        d = shape.d_model
        self.embed = torch.nn.Embedding(shape.vocab_size, d)
        self.pos = torch.nn.Embedding(shape.seq_len, d)
        layer = torch.nn.TransformerEncoderLayer(
            d, shape.n_head, 4 * d, dropout=0.0, batch_first=True, norm_first=True
        )
        self.body = torch.nn.TransformerEncoder(layer, shape.n_layer, enable_nested_tensor=False)
        self.norm = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, shape.vocab_size, bias=False)
        self.register_buffer(
            "mask", torch.nn.Transformer.generate_square_subsequent_mask(shape.seq_len), False
        )

    def forward(self, inputs, targets):
        t = inputs.shape[1]
        h = self.embed(inputs) + self.pos(torch.arange(t, device=inputs.device))
        h = self.body(h, mask=self.mask[:t, :t], is_causal=True)
        logits = self.head(self.norm(h))
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


class _LlamaLM(torch.nn.Module):
    def __init__(self, shape):
        super().__init__()
        import transformers

        config = transformers.LlamaConfig(
            vocab_size=shape.vocab_size,
            hidden_size=shape.d_model,
            intermediate_size=int(shape.d_model * 8 / 3) // 32 * 32,
            num_hidden_layers=shape.n_layer,
            num_attention_heads=shape.n_head,
            num_key_value_heads=shape.n_head,
            max_position_embeddings=shape.seq_len,
        )
        self.llama = transformers.LlamaForCausalLM(config)

    def forward(self, inputs, targets):
        logits = self.llama(input_ids=inputs).logits
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def build(name: str, shape, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    if name == "gpt":
        from examples.gpt import GPT, GPTConfig

        return GPT(
            GPTConfig(
                vocab_size=shape.vocab_size,
                n_layer=shape.n_layer,
                n_head=shape.n_head,
                d_model=shape.d_model,
                seq_len=shape.seq_len,
            )
        )
    if name == "torch_encoder":
        return _TorchEncoderLM(shape)
    if name == "hf_llama":
        return _LlamaLM(shape)
    raise ValueError(f"--model must be one of {', '.join(MODELS)}, got {name!r}")
