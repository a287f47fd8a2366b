"""Third-party model code for the stage-3 zoo: torch's own layers, Hugging Face transformers at
tiny random configs (built offline from a config, never downloaded) and peft.

Every entry builds its model from a fixed seed and says how a batch becomes a loss, so the
zoo can train it on gloo ranks and in one process and compare. Dropout is off everywhere (the
ranks and the reference draw different random numbers), and no model keeps batch statistics
(BatchNorm in training mode normalises per rank, so data parallelism itself would differ).

timm is left out: it imports torchvision, and the only torchvision the package index offers
beside this CPU torch is a CUDA build whose compiled operators do not load here. The vision
architectures it would bring are covered by Hugging Face's ViT and ConvNeXt.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

__all__ = ["ZooModel", "ZOO", "make_batches"]

VOCAB, SEQ, HIDDEN = 64, 8, 32


@dataclasses.dataclass(frozen=True)
class ZooModel:
    build: Callable[[], torch.nn.Module]
    """The model, from a fixed seed (called once per run, same weights every time)."""
    loss: Callable[[torch.nn.Module, dict], torch.Tensor]
    """The scalar loss of ``model`` on one batch (a dict of tensors; rows split across ranks)."""
    kind: str = "tokens"
    """What a batch holds: "tokens" (input_ids) or "pixels" (pixel_values + labels)."""
    needs: str = "transformers"
    """The package the model comes from (a test skips when it is missing)."""


def make_batches(kind: str, steps: int, rows: int) -> list[dict]:
    g = torch.Generator().manual_seed(99)
    if kind == "pixels":
        return [
            {
                "pixel_values": torch.randn(rows, 3, 16, 16, generator=g),
                "labels": torch.randint(0, 5, (rows,), generator=g),
            }
            for _ in range(steps)
        ]
    return [{"input_ids": torch.randint(0, VOCAB, (rows, SEQ), generator=g)} for _ in range(steps)]


def _lm_loss(model, batch):
    return model(input_ids=batch["input_ids"], labels=batch["input_ids"]).loss


def _seq2seq_loss(model, batch):
    ids = batch["input_ids"]
    return model(input_ids=ids, labels=ids.flip(1)).loss


def _image_loss(model, batch):
    return model(pixel_values=batch["pixel_values"], labels=batch["labels"]).loss


def _seeded(fn):
    def build():
        torch.manual_seed(1234)
        return fn()

    return build


# ---------------------------------------------------------------------------- torch.nn
class _TorchLM(torch.nn.Module):
    """Token embedding -> a torch.nn body -> vocabulary head."""

    def __init__(self, body: torch.nn.Module, decoder: bool = False):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, HIDDEN)
        self.body = body
        self.decoder = decoder
        self.head = torch.nn.Linear(HIDDEN, VOCAB)

    def forward(self, input_ids):
        h = self.embed(input_ids)
        h = self.body(h, h) if self.decoder else self.body(h)
        return self.head(h)


def _token_ce(model, batch):
    ids = batch["input_ids"]
    logits = model(ids)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), ids.roll(1, 1).reshape(-1))


def _torch_encoder():
    layer = torch.nn.TransformerEncoderLayer(HIDDEN, 4, 64, dropout=0.0, batch_first=True)
    return _TorchLM(torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False))


def _torch_transformer():
    body = torch.nn.Transformer(HIDDEN, 4, 1, 1, 64, dropout=0.0, batch_first=True)
    return _TorchLM(body, decoder=True)


class _ConvGRU(torch.nn.Module):
    """Conv1d + GroupNorm + GRU: convolution and recurrent weights (flat RNN weights)."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, HIDDEN)
        self.conv = torch.nn.Conv1d(HIDDEN, HIDDEN, 3, padding=1)
        self.norm = torch.nn.GroupNorm(4, HIDDEN)
        self.rnn = torch.nn.GRU(HIDDEN, HIDDEN, num_layers=2, batch_first=True)
        self.head = torch.nn.Linear(HIDDEN, VOCAB)

    def forward(self, ids):
        h = self.embed(ids).transpose(1, 2)
        h = torch.relu(self.norm(self.conv(h))).transpose(1, 2)
        h, _ = self.rnn(h)
        return self.head(h)


class _Checkpointed(torch.nn.Module):
    """A torch.nn stack whose blocks run under torch.utils.checkpoint (reentrant or not)."""

    def __init__(self, reentrant: bool, early_stop: bool = True):
        super().__init__()
        self.reentrant = reentrant
        self.early_stop = early_stop
        self.embed = torch.nn.Embedding(VOCAB, HIDDEN)
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(
                torch.nn.LayerNorm(HIDDEN),
                torch.nn.Linear(HIDDEN, 64),
                torch.nn.GELU(),
                torch.nn.Linear(64, HIDDEN),
            )
            for _ in range(3)
        )
        self.head = torch.nn.Linear(HIDDEN, VOCAB)

    def forward(self, ids):
        from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

        h = self.embed(ids)
        with set_checkpoint_early_stop(self.early_stop):
            for block in self.blocks:
                h = h + checkpoint(block, h, use_reentrant=self.reentrant)
        return self.head(h)


# ---------------------------------------------------------------------------- transformers
def _hf(config_name: str, model_name: str, **config):
    def build():
        import transformers

        cfg = getattr(transformers, config_name)(**config)
        return getattr(transformers, model_name)(cfg)

    return build


def _decoder_config(**extra):
    return dict(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        **extra,
    )


def _llama_checkpointed(reentrant: bool):
    def build():
        model = _hf("LlamaConfig", "LlamaForCausalLM", **_decoder_config())()
        model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": reentrant}
        )
        model.train()
        return model

    return build


def _llama_lora():
    import peft

    model = _hf("LlamaConfig", "LlamaForCausalLM", **_decoder_config())()
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    model = peft.get_peft_model(model, lora)
    # peft starts lora_B at zero, so the first step's gradient of lora_A is exactly zero;
    # random values give every adapter a gradient from the first step.
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.02)
    return model


_BERT = dict(
    vocab_size=VOCAB,
    hidden_size=HIDDEN,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=64,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)
_T5 = dict(
    vocab_size=VOCAB,
    d_model=HIDDEN,
    d_kv=8,
    d_ff=64,
    num_layers=2,
    num_heads=4,
    dropout_rate=0.0,
    decoder_start_token_id=0,
    pad_token_id=0,
)

ZOO: dict[str, ZooModel] = {
    "torch_encoder": ZooModel(_seeded(_torch_encoder), _token_ce, needs="torch"),
    "torch_transformer": ZooModel(_seeded(_torch_transformer), _token_ce, needs="torch"),
    "torch_conv_gru": ZooModel(_seeded(_ConvGRU), _token_ce, needs="torch"),
    "torch_checkpoint": ZooModel(_seeded(lambda: _Checkpointed(False)), _token_ce, needs="torch"),
    "torch_checkpoint_no_early_stop": ZooModel(
        _seeded(lambda: _Checkpointed(False, early_stop=False)), _token_ce, needs="torch"
    ),
    "torch_checkpoint_reentrant": ZooModel(
        _seeded(lambda: _Checkpointed(True)), _token_ce, needs="torch"
    ),
    "llama": ZooModel(
        _seeded(_hf("LlamaConfig", "LlamaForCausalLM", **_decoder_config())), _lm_loss
    ),
    "llama_tied_checkpointed": ZooModel(
        _seeded(
            lambda: _tie(_llama_checkpointed(False)()),
        ),
        _lm_loss,
    ),
    "llama_checkpointed_reentrant": ZooModel(_seeded(_llama_checkpointed(True)), _lm_loss),
    "gpt2": ZooModel(
        _seeded(
            _hf(
                "GPT2Config",
                "GPT2LMHeadModel",
                vocab_size=VOCAB,
                n_embd=HIDDEN,
                n_layer=2,
                n_head=4,
                n_positions=64,
                resid_pdrop=0.0,
                embd_pdrop=0.0,
                attn_pdrop=0.0,
            )
        ),
        _lm_loss,
    ),
    "bert_mlm": ZooModel(_seeded(_hf("BertConfig", "BertForMaskedLM", **_BERT)), _lm_loss),
    "albert": ZooModel(
        _seeded(_hf("AlbertConfig", "AlbertForMaskedLM", embedding_size=16, **_BERT)), _lm_loss
    ),
    "deberta_v2": ZooModel(
        _seeded(
            _hf(
                "DebertaV2Config",
                "DebertaV2ForMaskedLM",
                relative_attention=True,
                position_buckets=8,
                pos_att_type=["p2c", "c2p"],
                **_BERT,
            )
        ),
        _lm_loss,
    ),
    "mamba": ZooModel(
        _seeded(
            _hf(
                "MambaConfig",
                "MambaForCausalLM",
                vocab_size=VOCAB,
                hidden_size=HIDDEN,
                state_size=4,
                num_hidden_layers=2,
                expand=2,
                conv_kernel=4,
                use_mambapy=True,
            )
        ),
        _lm_loss,
    ),
    "t5": ZooModel(_seeded(_hf("T5Config", "T5ForConditionalGeneration", **_T5)), _seq2seq_loss),
    "switch_moe": ZooModel(
        _seeded(
            _hf(
                "SwitchTransformersConfig",
                "SwitchTransformersForConditionalGeneration",
                num_experts=4,
                expert_capacity=64,
                num_sparse_encoder_layers=1,
                num_sparse_decoder_layers=1,
                router_z_loss_coef=0.0,
                router_aux_loss_coef=0.0,
                router_jitter_noise=0.0,
                **_T5,
            )
        ),
        _seq2seq_loss,
    ),
    "mixtral_moe": ZooModel(
        _seeded(
            _hf(
                "MixtralConfig",
                "MixtralForCausalLM",
                num_local_experts=4,
                num_experts_per_tok=2,
                output_router_logits=False,
                **_decoder_config(),
            )
        ),
        _lm_loss,
    ),
    "llama_lora": ZooModel(_seeded(_llama_lora), _lm_loss, needs="peft"),
    "vit": ZooModel(
        _seeded(
            _hf(
                "ViTConfig",
                "ViTForImageClassification",
                image_size=16,
                patch_size=4,
                num_labels=5,
                hidden_size=HIDDEN,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=64,
                hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0,
            )
        ),
        _image_loss,
        kind="pixels",
    ),
    "convnext": ZooModel(
        _seeded(
            _hf(
                "ConvNextConfig",
                "ConvNextForImageClassification",
                num_channels=3,
                num_stages=2,
                hidden_sizes=[8, 16],
                depths=[1, 1],
                num_labels=5,
                image_size=16,
            )
        ),
        _image_loss,
        kind="pixels",
    ),
}


def _tie(model):
    """Input embedding and output head share one weight."""
    model.lm_head.weight = model.model.embed_tokens.weight
    return model
