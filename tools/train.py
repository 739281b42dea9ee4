"""Train laquant's reference language models (and their BPE tokenizer) from local text.

    python tools/train.py tokenizer --data-dir ../shared/data --out OUT/tokenizer
    python tools/train.py model --size small --data-dir ../shared/data --tokenizer OUT/tokenizer --out OUT/gla-small
    python tools/train.py model --arch qwen3_next --size small ... --out OUT/qwen3next-small
    python tools/train.py model --arch kimi_linear --size small ... --out OUT/kimilinear-small
    python tools/train.py model --arch nemotron_h --size small ... --out OUT/nemotronh-small

GLA: fla's ``GLAForCausalLM`` when flash-linear-attention and a GPU are there (its Triton
kernels train fast), else laquant's own implementation of the same architecture: both write the
same checkpoint format. The hybrids are transformers' classes with laquant's mixers installed:
``qwen3_next`` (Gated DeltaNet layers with a gated softmax-attention layer every 4th),
``kimi_linear`` (Kimi Delta Attention, the delta rule with a per-channel decay, with an MLA
softmax-attention layer every 4th) and ``nemotron_h`` (typed blocks: Mamba2, ReLU^2 MLP, GQA
softmax attention). Only ``train/`` and the English files of ``calibration/`` are read:
``eval/`` text never reaches training.
"""

from __future__ import annotations

import argparse
import json
import lzma
import math
import os
import time
from pathlib import Path

import numpy as np
import torch

# English training text, relative to the shared data folder.
TRAIN_FILES = [
    "train/gutenberg.txt.xz",
    "train/us_presidential_speeches.txt.xz",
    "train/genesis_en.txt.xz",
    "train/movie_reviews.txt.xz",
    "train/tinyshakespeare.txt.xz",
    "calibration/wiki.utf8",
    "calibration/c4.utf8",
    "calibration/tiny.utf8",
    "calibration/technical.utf8",
]
EOS = "<|endoftext|>"

# Model sizes: fla GLA defaults (expand_k 0.5, expand_v 1, SwiGLU MLP with hidden_ratio 4).
SIZES = {
    "small": dict(hidden_size=256, num_hidden_layers=6, num_heads=4),  # ~9M parameters
    "large": dict(hidden_size=512, num_hidden_layers=12, num_heads=4),  # ~49M parameters
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_heads=2),  # smoke tests only
}
# qwen3_next-style hybrids: 3 Gated DeltaNet layers, then one gated softmax-attention layer, dense
# SwiGLU MLPs (num_experts 0: the trained reference has no MoE; tests cover routers on random configs)
HYBRID_SIZES = {
    "small": dict(hidden_size=256, num_hidden_layers=8, intermediate_size=704, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4,
                  linear_key_head_dim=64, linear_value_head_dim=64, num_experts=0),  # ~9M parameters
    "tiny": dict(hidden_size=64, num_hidden_layers=4, intermediate_size=128, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=32, linear_num_key_heads=1, linear_num_value_heads=2,
                 linear_key_head_dim=32, linear_value_head_dim=32, num_experts=0),
    # the MoE form (Qwen3-Next's own): 8 routed experts, 2 a token, and a shared expert in every layer, trained with
    # the router's load-balancing loss; the reference for the accuracy of quantized experts
    "small_moe": dict(hidden_size=256, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                      linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64,
                      linear_value_head_dim=64, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=256,
                      shared_expert_intermediate_size=256, decoder_sparse_step=1, output_router_logits=True),
}
# kimi_linear: 3 KDA layers, then one MLA softmax-attention layer (no q low rank), dense SwiGLU MLPs
KIMI_SIZES = {
    "small": dict(hidden_size=256, num_hidden_layers=8, intermediate_size=704, num_attention_heads=4,
                  num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=128, qk_rope_head_dim=32, qk_nope_head_dim=32,
                  v_head_dim=64, linear_num_heads=4, linear_head_dim=64),  # ~11M parameters
    "tiny": dict(hidden_size=64, num_hidden_layers=4, intermediate_size=128, num_attention_heads=2,
                 num_key_value_heads=2, q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16,
                 v_head_dim=16, linear_num_heads=2, linear_head_dim=16),
}
# nemotron_h: typed blocks, Mamba2 (M), ReLU^2 MLP (-) and GQA softmax attention (*) in Nemotron-H's
# order, M-M-M*-M-M-M*- (the pattern string below, one character a block)
NEMOTRON_SIZES = {
    "small": dict(hidden_size=256, pattern="M-M-M*-M-M-M*-", intermediate_size=768, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=64, mamba_num_heads=8, mamba_head_dim=64, n_groups=1,
                  ssm_state_size=64, chunk_size=64),  # ~10M parameters
    "tiny": dict(hidden_size=64, pattern="M-*M-", intermediate_size=128, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=32, mamba_num_heads=2, mamba_head_dim=32, n_groups=1,
                 ssm_state_size=16, chunk_size=16),
}
ARCH_SIZES = {"gla": SIZES, "qwen3_next": HYBRID_SIZES, "kimi_linear": KIMI_SIZES, "nemotron_h": NEMOTRON_SIZES}
ARCHS = tuple(ARCH_SIZES)
# transformers' hybrids: the class trained, as training.json names it
HYBRID_CLASSES = {"qwen3_next": "Qwen3NextForCausalLM", "kimi_linear": "KimiLinearForCausalLM",
                  "nemotron_h": "NemotronHForCausalLM"}
NEMOTRON_BLOCKS = {"M": "linear_attention", "-": "mlp", "*": "full_attention"}


def read_documents(data_dir: Path) -> list[str]:
    docs = []
    for rel in TRAIN_FILES:
        path = data_dir / rel
        opener = lzma.open if path.suffix == ".xz" else open
        with opener(path, "rt", encoding="utf-8") as f:
            docs.extend(d.strip() for d in f.read().split("\n\n") if d.strip())
    return docs


def train_tokenizer(data_dir: Path, out: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=True,
    )
    tok.train_from_iterator(read_documents(data_dir), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOS, eos_token=EOS, unk_token=EOS,
                                   model_max_length=1_000_000)
    fast.save_pretrained(out)
    print(f"tokenizer: {tok.get_vocab_size()} tokens -> {out}")


def tokenize_corpus(data_dir: Path, tokenizer_dir: Path) -> np.ndarray:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    docs = read_documents(data_dir)
    ids = tok(docs, add_special_tokens=False)["input_ids"]
    flat = np.fromiter((t for d in ids for t in (*d, tok.eos_token_id)), dtype=np.uint16)
    return flat


def build_model(size: str, vocab_size: int, eos_id: int, impl: str, arch: str = "gla"):
    common = dict(vocab_size=vocab_size, bos_token_id=eos_id, eos_token_id=eos_id, tie_word_embeddings=False)
    if arch != "gla":
        # transformers' hybrids with laquant's mixers installed: the linear layers train on laquant's
        # differentiable reference ops (the Triton kernels are forward-only; fla 0.6's chunked backward
        # refuses Triton < 3.7.1 on Hopper, and transformers' own fallbacks loop over every chunk row)
        from laquant.adapters import install

        model = _hybrid(arch, dict(ARCH_SIZES[arch][size]), common)
        install(model)
        return model
    cfg = dict(SIZES[size], **common, max_position_embeddings=2048)
    if impl == "fla":
        from fla.models import GLAConfig, GLAForCausalLM
    else:
        from laquant.models import GLAConfig, GLAForCausalLM
    return GLAForCausalLM(GLAConfig(**cfg))


def _every_fourth_attention(n: int) -> list[str]:
    return ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n)]


def _hybrid(arch: str, cfg: dict, common: dict):
    import transformers

    if arch == "qwen3_next":
        cfg["layer_types"] = _every_fourth_attention(cfg["num_hidden_layers"])
    elif arch == "kimi_linear":
        n = cfg["num_hidden_layers"]
        cfg.update(layer_types=_every_fourth_attention(n), mlp_layer_types=["dense"] * n, pad_token_id=common["eos_token_id"])
    elif arch == "nemotron_h":
        cfg["layers_block_type"] = [NEMOTRON_BLOCKS[c] for c in cfg.pop("pattern")]
        cfg["pad_token_id"] = common["eos_token_id"]
    config_class = getattr(transformers, HYBRID_CLASSES[arch].replace("ForCausalLM", "Config"))
    model_class = getattr(transformers, HYBRID_CLASSES[arch])
    return model_class(config_class(**cfg, **common, max_position_embeddings=32768))


def train_model(args: argparse.Namespace) -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    impl = args.impl
    if impl == "auto":
        try:
            import fla  # noqa: F401
            impl = "fla" if device == "cuda" else "laquant"
        except ImportError:
            impl = "laquant"
    sizes = ARCH_SIZES[args.arch]
    if args.size not in sizes:
        raise SystemExit(f"--size {args.size} is not defined for --arch {args.arch}; choose from {', '.join(sizes)}")
    torch.manual_seed(args.seed)
    tokens = tokenize_corpus(Path(args.data_dir), Path(args.tokenizer))
    n_val = max(args.seq_len * 8, len(tokens) // 200)
    train_tokens, val_tokens = tokens[:-n_val], tokens[-n_val:]
    print(f"corpus: {len(tokens):,} tokens ({len(train_tokens):,} train, {n_val:,} validation)", flush=True)

    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    model = build_model(args.size, len(tok), tok.eos_token_id, impl, args.arch).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    shown = impl if args.arch == "gla" else f"transformers {HYBRID_CLASSES[args.arch]} + laquant mixers"
    print(f"model: {args.arch} {args.size}, {n_params / 1e6:.1f}M parameters, impl={shown}, device={device}", flush=True)

    tokens_per_step = args.batch * args.seq_len
    steps = args.steps or int(args.epochs * len(train_tokens) / tokens_per_step)
    warmup = max(1, int(0.02 * steps))
    probe = 10  # with --time-budget: steps timed before the run's length is fixed
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.dim() < 2 or "norm" in name or "bias" in name else decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), fused=device == "cuda")

    def lr_at(step: int) -> float:
        if step < warmup:
            return args.lr * (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    data = torch.from_numpy(train_tokens.astype(np.int64))
    val = torch.from_numpy(val_tokens.astype(np.int64))
    gen = torch.Generator().manual_seed(args.seed)
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda")

    @torch.no_grad()
    def val_loss() -> float:
        model.eval()
        n = len(val) // args.seq_len
        windows = val[: n * args.seq_len].view(n, args.seq_len)
        losses = []
        for i in range(0, n, args.batch):
            batch = windows[i:i + args.batch].to(device)
            with autocast:
                losses.append(model(input_ids=batch, labels=batch).loss.float().item())
        model.train()
        return float(np.mean(losses))

    history = {"step": [], "tokens": [], "loss": [], "lr": [], "val_step": [], "val_loss": []}
    model.train()
    t0 = time.time()
    step = 0
    while step < steps:
        if args.time_budget and step == probe:
            per_step = (time.time() - t0) / probe
            steps = min(steps, max(probe + 1, int(args.time_budget / per_step)))
            print(f"time budget {args.time_budget:.0f}s: {steps} steps ({per_step:.2f}s each)", flush=True)
        starts = torch.randint(0, len(data) - args.seq_len - 1, (args.batch,), generator=gen)
        batch = torch.stack([data[s:s + args.seq_len] for s in starts.tolist()]).to(device, non_blocking=True)
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        with autocast:
            loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % args.log_every == 0 or step == steps - 1:
            loss_value = loss.item()
            history["step"].append(step)
            history["tokens"].append((step + 1) * tokens_per_step)
            history["loss"].append(loss_value)
            history["lr"].append(lr_at(step))
            rate = (step + 1) * tokens_per_step / (time.time() - t0)
            print(f"step {step}/{steps} loss {loss_value:.4f} lr {lr_at(step):.2e} {rate / 1e3:.0f}K tok/s", flush=True)
        if (step + 1) % args.val_every == 0 or step == steps - 1:
            history["val_step"].append(step)
            history["val_loss"].append(val_loss())
            print(f"  validation loss {history['val_loss'][-1]:.4f}", flush=True)
        step += 1
    elapsed = time.time() - t0

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    # Keep the checkpoint loadable without fla: drop fla-only config keys' class references.
    cfg = json.loads((out / "config.json").read_text())
    cfg.pop("auto_map", None)
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    summary = {
        "arch": args.arch, "size": args.size,
        "impl": impl if args.arch == "gla" else f"transformers {HYBRID_CLASSES[args.arch]}, linear layers on laquant's ops",
        "parameters": n_params, "config": ARCH_SIZES[args.arch][args.size],
        "vocab_size": len(tok), "seq_len": args.seq_len, "batch": args.batch, "steps": steps,
        "epochs": steps * tokens_per_step / len(train_tokens), "lr": args.lr, "weight_decay": args.weight_decay,
        "schedule": "linear warmup 2%, cosine to 10% of peak", "optimizer": "AdamW(0.9, 0.95), grad clip 1.0",
        "precision": "bf16 autocast, fp32 master weights; saved as bf16", "seed": args.seed,
        "corpus_tokens": int(len(tokens)), "train_files": TRAIN_FILES,
        "final_val_loss": history["val_loss"][-1], "seconds": elapsed,
        "tokens_per_second": steps * tokens_per_step / elapsed,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__, "history": history,
    }
    (out / "training.json").write_text(json.dumps(summary, indent=2) + "\n")
    from laquant.eval.plots import plot_training_history

    plot_training_history(history, out / "loss_curve.png", title=f"{args.arch} {args.size} ({n_params / 1e6:.1f}M params)")
    print(f"saved {out} ({elapsed:.0f}s, final validation loss {summary['final_val_loss']:.4f})")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python tools/train.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    p_tok = sub.add_parser("tokenizer", help="train the byte-level BPE tokenizer")
    p_tok.add_argument("--data-dir", required=True)
    p_tok.add_argument("--out", required=True)
    p_tok.add_argument("--vocab-size", type=int, default=8192)
    p_model = sub.add_parser("model", help="train a causal LM (GLA or a hybrid: qwen3_next, kimi_linear, nemotron_h)")
    p_model.add_argument("--data-dir", required=True)
    p_model.add_argument("--tokenizer", required=True)
    p_model.add_argument("--out", required=True)
    p_model.add_argument("--arch", choices=ARCHS, default="gla")
    p_model.add_argument("--size", choices=sorted({s for sizes in ARCH_SIZES.values() for s in sizes}), default="small")
    p_model.add_argument("--impl", choices=["auto", "fla", "laquant"], default="auto")
    p_model.add_argument("--seq-len", type=int, default=2048)
    p_model.add_argument("--batch", type=int, default=32)
    p_model.add_argument("--epochs", type=float, default=2.0)
    p_model.add_argument("--steps", type=int, default=0, help="overrides --epochs when > 0")
    p_model.add_argument("--time-budget", type=float, default=0,
                         help="seconds of training at most: after 10 steps the run is shortened to fit")
    p_model.add_argument("--lr", type=float, default=3e-3)
    p_model.add_argument("--weight-decay", type=float, default=0.1)
    p_model.add_argument("--log-every", type=int, default=20)
    p_model.add_argument("--val-every", type=int, default=200)
    p_model.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.what == "tokenizer":
        train_tokenizer(Path(args.data_dir), Path(args.out), args.vocab_size)
    else:
        train_model(args)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    main()
