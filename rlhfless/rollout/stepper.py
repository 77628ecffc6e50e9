"""One decode iteration (one new token per row) over a KV cache, with rows that can be dropped between steps.

Two implementations of the same step, chosen by `make_stepper`:
- `FastStepper` (Qwen2-family models): a preallocated KV buffer of [R, kv_heads, prompt + max_new, head_dim] per
  layer, written in place (no per-step `torch.cat` of the whole cache), and attention by `scaled_dot_product_attention`
  with `enable_gqa=True` (no `repeat_kv` copy of K and V to every query head). It calls the model's own
  submodules (norms, projections, rotary embedding, MLP, lm_head) in the order of the HF forward, so its logits
  match `model(...)` to float rounding (tests check greedy outputs equal HF `generate`).
- `HFStepper` (any causal LM): the model's own forward with a `DynamicCache`, as a fallback.
Why a hand-written step: on a tiny model the HF decode step is dominated by copies (cache concatenation and the
GQA head expansion), not by arithmetic; measured in `rlhfless bench engine`.
Non-goals: paged KV, admitting new rows after prefill (the batch only shrinks), sliding-window attention.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class HFStepper:
    """Decode step through the model's own forward (any HF causal LM)."""

    def __init__(self, model, cache, mask: torch.Tensor):
        self.model, self.cache, self.mask = model, cache, mask

    @property
    def context(self) -> int:
        return int(self.mask.shape[1])

    def select(self, keep: torch.Tensor) -> None:
        keep = keep.to(self.mask.device)
        self.cache.batch_select_indices(keep)
        self.mask = self.mask[keep]

    def step(self, tok: torch.Tensor, pos: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
        dev = self.mask.device
        tok, pos, live = tok.to(dev), pos.to(dev), live.to(dev)
        self.mask = torch.cat([self.mask, live.long().unsqueeze(-1)], dim=1)
        out = self.model(input_ids=tok.unsqueeze(-1), attention_mask=self.mask, position_ids=pos.unsqueeze(-1),
                         past_key_values=self.cache, use_cache=True)
        return out.logits[:, -1, :].float()


class FastStepper:
    """Decode step on a preallocated KV buffer (Qwen2-family models); see the module docstring."""

    def __init__(self, model, cache, mask: torch.Tensor, max_new: int):
        self.model = model
        rows, width = mask.shape
        cap = width + max_new
        self.keys, self.values = [], []
        for layer in cache.layers:
            k, v = layer.keys, layer.values
            kb = k.new_zeros(rows, k.shape[1], cap, k.shape[3])
            vb = v.new_zeros(rows, v.shape[1], cap, v.shape[3])
            kb[:, :, :width] = k
            vb[:, :, :width] = v
            self.keys.append(kb)
            self.values.append(vb)
        self.mask = torch.zeros(rows, cap, dtype=torch.bool, device=mask.device)
        self.mask[:, :width] = mask.bool()
        self.length = width

    @staticmethod
    def supports(model) -> bool:
        cfg = model.config
        return (getattr(cfg, "model_type", "") == "qwen2" and not getattr(cfg, "use_sliding_window", False)
                and getattr(model.config, "_attn_implementation", "sdpa") in ("sdpa", "eager"))

    @property
    def context(self) -> int:
        return self.length

    def select(self, keep: torch.Tensor) -> None:
        # Copy only the filled part: the unused tail of the buffer needs no data.
        n = self.length
        keep = keep.to(self.mask.device)
        for buf in (self.keys, self.values):
            for i, b in enumerate(buf):
                new = b.new_empty(len(keep), *b.shape[1:])
                new[:, :, :n] = b[keep, :, :n]
                buf[i] = new
        self.mask = self.mask[keep]

    def step(self, tok: torch.Tensor, pos: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
        from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

        inner = self.model.model
        n = self.length
        dev = self.mask.device
        tok, pos, live = tok.to(dev), pos.to(dev), live.to(dev)
        self.mask[:, n] = live
        attn_mask = self.mask[:, None, None, : n + 1]
        h = inner.embed_tokens(tok.unsqueeze(-1))  # [R, 1, H]
        cos, sin = inner.rotary_emb(h, pos.unsqueeze(-1))
        rows = h.shape[0]
        for layer, kb, vb in zip(inner.layers, self.keys, self.values):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q = attn.q_proj(x).view(rows, 1, -1, attn.head_dim).transpose(1, 2)
            k = attn.k_proj(x).view(rows, 1, -1, attn.head_dim).transpose(1, 2)
            v = attn.v_proj(x).view(rows, 1, -1, attn.head_dim).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            kb[:, :, n] = k[:, :, 0]
            vb[:, :, n] = v[:, :, 0]
            o = F.scaled_dot_product_attention(q, kb[:, :, : n + 1], vb[:, :, : n + 1], attn_mask=attn_mask,
                                               scale=attn.scaling, enable_gqa=True)
            h = h + attn.o_proj(o.transpose(1, 2).reshape(rows, 1, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        self.length = n + 1
        return self.model.lm_head(inner.norm(h))[:, -1, :].float()


def make_stepper(model, cache, mask: torch.Tensor, max_new: int, impl: str = "auto"):
    """`FastStepper` when the model supports it (impl "auto" or "fast"), else `HFStepper` (impl "hf")."""
    if impl == "fast" or (impl == "auto" and FastStepper.supports(model)):
        return FastStepper(model, cache, mask, max_new)
    return HFStepper(model, cache, mask)
