"""A real client: a tiny Llama quantized by transformers' fine-grained FP8 path, served by fp8select.

    pip install -e ".[integration]"          # transformers; the example runs on a CUDA GPU
    python examples/transformers_fp8.py --out result.json

What it does, with no download (a random 2-layer Llama-style model):

1. builds the bf16 model from a config (hidden 1024, intermediate 2816, vocab 1024 by default);
2. quantizes it the way ``from_pretrained(..., quantization_config=FineGrainedFP8Config())``
   does: ``replace_with_fp8_linear`` turns every ``nn.Linear`` but ``lm_head`` into
   transformers' ``FP8Linear``, and its ``Fp8Quantize`` op makes each fp8 weight and its
   ``weight_scale_inv`` (block [128, 128]);
3. copies that model and swaps its ``FP8Linear`` layers for fp8select's ``BlockFp8Linear``
   (:func:`fp8select.integrations.transformers.replace_fp8_linears`, same tensors);
4. compares fp8select with transformers' own FP8 path layer by layer (each swapped layer
   on the input transformers' layer saw) and by logits (relative Frobenius error and
   next-token agreement), eager and under ``torch.compile``, and with the bf16 model.
   Model-level differences of a few percent are expected between any two FP8
   implementations, compiled or not: a bf16 output that rounds differently moves some
   activation across an fp8 rounding boundary in the next layer (``bf16_compiled_vs_eager``
   shows the same effect without fp8, smaller); the per-layer figure is the kernels' own;
5. times a prefill (batch 1 x 512 tokens) and a decode-size step (batch 1 x 1 token, every
   linear at M=1; compiled with ``mode="reduce-overhead"``, i.e. CUDA graphs) each way.

transformers' FP8 kernels come from the Hugging Face Kernel Hub (``kernels`` package). Where
the hub cannot be reached, its forward fails; the example then tries transformers' DeepGEMM
path with a locally installed ``deep_gemm`` package in place of the hub build, and else uses
the FP8 model's dequantized weights (bf16 of ``weight * weight_scale_inv`` through
transformers' own ``FP8Linear.forward``, which then runs ``F.linear``) with the activations
rounded per token and 1x128 group as the FP8 kernels round them (emulated in fp32, so the
comparison isolates the kernels). The JSON summary says which (``transformers_reference.path``)
and why the others could not run.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import statistics
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch

import fp8select
from fp8select.integrations.transformers import replace_fp8_linears
from fp8select.nn import BlockFp8Linear


@dataclass(frozen=True)
class Options:
    device: str = "cuda"
    hidden: int = 1024
    intermediate: int = 2816
    layers: int = 2
    heads: int = 8
    kv_heads: int = 2
    vocab: int = 1024
    tokens: int = 512
    seed: int = 0
    backend: str | None = None
    compile: bool = True
    timing: bool = True
    reps: int = 20


# -- the models ------------------------------------------------------------------------------

def build_bf16_model(opt: Options) -> torch.nn.Module:
    """A random Llama-style causal LM in bf16 (every linear dimension a multiple of 128)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=opt.hidden, intermediate_size=opt.intermediate, num_hidden_layers=opt.layers,
                         num_attention_heads=opt.heads, num_key_value_heads=opt.kv_heads, head_dim=opt.hidden // opt.heads,
                         vocab_size=opt.vocab, max_position_embeddings=max(2048, opt.tokens), tie_word_embeddings=False)
    torch.manual_seed(opt.seed)
    return LlamaForCausalLM(config).to(device=opt.device, dtype=torch.bfloat16).eval()


def quantize_with_transformers(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` quantized by transformers' fine-grained FP8 path (block [128, 128])."""
    from transformers import FineGrainedFP8Config
    from transformers.integrations.finegrained_fp8 import FP8Linear, Fp8Quantize, replace_with_fp8_linear
    from transformers.quantizers.quantizer_finegrained_fp8 import FineGrainedFP8HfQuantizer

    config = FineGrainedFP8Config(weight_block_size=(128, 128))
    quantize = Fp8Quantize(FineGrainedFP8HfQuantizer(config, pre_quantized=False))
    originals = dict(model.named_modules())
    fp8_model = copy.deepcopy(model)
    replace_with_fp8_linear(fp8_model, modules_to_not_convert=["lm_head"], quantization_config=config)
    for name, module in fp8_model.named_modules():
        if not isinstance(module, FP8Linear):
            continue
        source = originals[name]
        tensors = quantize.convert({f"{name}.weight": source.weight.detach()})
        module.weight = torch.nn.Parameter(tensors[f"{name}.weight"], requires_grad=False)
        module.weight_scale_inv = torch.nn.Parameter(tensors[f"{name}.weight_scale_inv"], requires_grad=False)
        if source.bias is not None:
            module.bias = torch.nn.Parameter(source.bias.detach().clone(), requires_grad=False)
    return fp8_model


def dequantized_copy(fp8_model: torch.nn.Module) -> torch.nn.Module:
    """The FP8 model run by transformers' own ``FP8Linear.forward`` on dequantized weights, with the
    FP8 kernels' activation rounding emulated: each FP8Linear weight becomes bf16 ``weight *
    weight_scale_inv`` (so the forward takes its ``F.linear`` branch), and a pre-hook quantizes and
    dequantizes its input per token and 1x128 group (scale = amax / 448, e4m3), in fp32."""
    from transformers.integrations.finegrained_fp8 import FP8Linear

    from fp8select.backends.reference import dequantize_weight

    model = copy.deepcopy(fp8_model)
    for module in model.modules():
        if isinstance(module, FP8Linear):
            block = tuple(module.block_size)
            w = dequantize_weight(module.weight, module.weight_scale_inv, block, torch.bfloat16)
            module.weight = torch.nn.Parameter(w, requires_grad=False)
            module.register_forward_pre_hook(lambda _m, args, group=block[1]: (fake_quantize(args[0], group),))
    return model


def fake_quantize(x: torch.Tensor, group: int) -> torch.Tensor:
    """``x`` rounded as a per-token 1 x ``group`` e4m3 quantization would round it, in x's dtype."""
    fmax = torch.finfo(torch.float8_e4m3fn).max
    k = x.shape[-1]
    groups = -(-k // group)
    padded = torch.nn.functional.pad(x.float().reshape(-1, k), (0, groups * group - k)).view(-1, groups, group)
    scale = padded.abs().amax(dim=-1, keepdim=True).clamp_min(1e-10) / fmax
    q = (padded / scale).clamp(-fmax, fmax).to(torch.float8_e4m3fn).float() * scale
    return q.view(-1, groups * group)[:, :k].reshape(x.shape).to(x.dtype)


@contextlib.contextmanager
def transformers_deepgemm_from_local_package() -> Iterator[None]:
    """Let transformers' DeepGEMM path use the installed ``deep_gemm`` instead of the Kernel Hub build."""
    import deep_gemm
    from transformers.integrations import deepgemm, finegrained_fp8, hub_kernels

    saved = (deepgemm.is_deepgemm_loadable, finegrained_fp8.is_deepgemm_loadable,
             hub_kernels._KERNEL_MODULE_MAPPING.get("deep-gemm"))

    def loadable(raise_error: bool = False) -> bool:
        return True

    deepgemm.is_deepgemm_loadable = finegrained_fp8.is_deepgemm_loadable = loadable
    hub_kernels._KERNEL_MODULE_MAPPING["deep-gemm"] = deep_gemm
    try:
        yield
    finally:
        deepgemm.is_deepgemm_loadable, finegrained_fp8.is_deepgemm_loadable = saved[0], saved[1]
        hub_kernels._KERNEL_MODULE_MAPPING["deep-gemm"] = saved[2]


@dataclass
class Reference:
    """transformers' FP8 path as it could run here: a model, the context it runs in, and what it is."""

    model: torch.nn.Module
    context: Callable[[], contextlib.AbstractContextManager[Any]]
    path: str
    attempts: list[dict[str, str]]


def _kernel_in_use() -> str:
    from transformers.integrations import deepgemm, finegrained_fp8

    if getattr(deepgemm, "_DEEPGEMM", None) is not None:
        return "deepgemm"
    if getattr(finegrained_fp8, "_FINEGRAINED_FP8", None) is not None:
        return "finegrained-fp8-triton"
    return "unknown-kernel"


def transformers_reference(fp8_model: torch.nn.Module, ids: torch.Tensor) -> tuple[Reference, torch.Tensor]:
    """The first of transformers' FP8 paths that runs here, and its logits."""
    attempts: list[dict[str, str]] = []
    candidates: list[tuple[str, torch.nn.Module, Callable[[], contextlib.AbstractContextManager[Any]]]] = [
        ("transformers-fp8 (Kernel Hub kernel)", fp8_model, contextlib.nullcontext),
        ("transformers-fp8 deepgemm (local deep_gemm package)", fp8_model, transformers_deepgemm_from_local_package),
    ]
    for label, model, context in candidates:
        try:
            with context():
                logits = logits_of(model, ids)
            if not bool(torch.isfinite(logits).all()):
                raise FloatingPointError("non-finite logits")
            path = label if "deepgemm" in label else f"{label}: {_kernel_in_use()}"
            attempts.append({"path": label, "outcome": "used"})
            return Reference(model, context, path, attempts), logits
        except Exception as exc:  # noqa: BLE001 - any failure of an optional path means: try the next
            attempts.append({"path": label, "outcome": f"failed: {type(exc).__name__}: {str(exc)[:300]}"})
    model = dequantized_copy(fp8_model)
    label = ("transformers-dequantized: FP8Linear.forward on bf16 weight*weight_scale_inv, activations rounded "
             "per 1x128 group as the FP8 kernels do (emulated in fp32)")
    attempts.append({"path": label, "outcome": "used"})
    return Reference(model, contextlib.nullcontext, label, attempts), logits_of(model, ids)


# -- measuring -------------------------------------------------------------------------------

@torch.inference_mode()
def logits_of(model: Callable[..., Any], ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids, use_cache=False).logits.float().clone()


def compare(out: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    """Relative Frobenius error (fp64) and the fraction of positions with the same next token."""
    diff = out.double() - ref.double()
    rel = float("inf") if not bool(torch.isfinite(diff).all()) else float(diff.norm() / ref.double().norm().clamp_min(1e-30))
    agree = float((out.argmax(-1) == ref.argmax(-1)).double().mean())
    return {"rel_err": rel, "top1_agreement": agree}


def per_layer(ours: torch.nn.Module, ref: Reference, ids: torch.Tensor) -> dict[str, Any]:
    """Each swapped layer against transformers' layer on the same input (the one the reference run
    gave that layer): the kernels' own agreement, free of the divergence the two models build up
    when one output element rounds differently and later layers' fp8 rounding amplifies it."""
    from transformers.integrations.finegrained_fp8 import FP8Linear

    inputs: dict[str, torch.Tensor] = {}
    hooks = [m.register_forward_pre_hook(lambda _m, args, name=name: inputs.__setitem__(name, args[0].detach().clone()),
                                         prepend=True)
             for name, m in ref.model.named_modules() if isinstance(m, FP8Linear)]
    try:
        with ref.context():
            logits_of(ref.model, ids)
    finally:
        for hook in hooks:
            hook.remove()
    theirs, mine = dict(ref.model.named_modules()), dict(ours.named_modules())
    errors: dict[str, float] = {}
    with ref.context(), torch.inference_mode():
        for name, x in inputs.items():
            errors[name] = compare(mine[name](x).float(), theirs[name](x).float())["rel_err"]
    worst = max(errors, key=errors.__getitem__)
    return {"layers": len(errors), "worst_rel_err": errors[worst], "worst_layer": worst}


def median_ms(fn: Callable[[], Any], reps: int, warmup: int = 3) -> float:
    """Median wall time of ``fn`` on the GPU (CUDA events), after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def graph_breaks(model: torch.nn.Module, ids: torch.Tensor) -> int:
    torch._dynamo.reset()
    with torch.inference_mode():
        return int(torch._dynamo.explain(model)(input_ids=ids, use_cache=False).graph_break_count)


def compiled(model: torch.nn.Module, mode: str | None) -> Callable[..., Any]:
    torch._dynamo.reset()  # each model and mode gets a fresh cache (they share LlamaForCausalLM.forward)
    return torch.compile(model, mode=mode, dynamic=False)


# -- the run ---------------------------------------------------------------------------------

def run(opt: Options) -> dict[str, Any]:
    import transformers

    device = torch.device(opt.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("this example needs a CUDA GPU (or --device cpu for a slow functional run)")
    bf16 = build_bf16_model(opt)
    fp8 = quantize_with_transformers(bf16)
    selection = fp8select.resolve(backend=opt.backend) if opt.backend else fp8select.resolve()
    ours = copy.deepcopy(fp8)
    swap = replace_fp8_linears(ours, selection)
    modules = [m for m in ours.modules() if isinstance(m, BlockFp8Linear)]
    gen = torch.Generator(device="cpu").manual_seed(opt.seed + 1)
    ids = torch.randint(0, opt.vocab, (1, opt.tokens), generator=gen).to(device)
    step = ids[:, :1]

    logits = {"bf16": logits_of(bf16, ids), "fp8select": logits_of(ours, ids)}
    ref, logits["transformers"] = transformers_reference(fp8, ids)
    result: dict[str, Any] = {
        "options": asdict(opt),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "fp8select": fp8select.__version__},
        "fp8select": {"backend": selection.backend.name, "chain": [b.name for b in selection.chain],
                      "layers_by_backend": dict(Counter(str(m.backend) for m in modules))},
        "replaced": len(swap.replaced), "skipped": [list(s) for s in swap.skipped],
        "transformers_reference": {"path": ref.path, "attempts": ref.attempts},
        "per_layer_vs_transformers": per_layer(ours, ref, ids),
        "logits": {
            "fp8select_vs_transformers": compare(logits["fp8select"], logits["transformers"]),
            "fp8select_vs_bf16": compare(logits["fp8select"], logits["bf16"]),
            "transformers_vs_bf16": compare(logits["transformers"], logits["bf16"]),
        },
    }
    if opt.compile:
        result["graph_breaks"] = {"bf16": graph_breaks(bf16, ids), "fp8select": graph_breaks(ours, ids)}
        logits["fp8select_compiled"] = logits_of(compiled(ours, None), ids)
        # The floor for any two implementations: Inductor's fusions round bf16 differently.
        result["logits"]["bf16_compiled_vs_eager"] = compare(logits_of(compiled(bf16, None), ids), logits["bf16"])
        result["logits"]["fp8select_compiled_vs_eager"] = compare(logits["fp8select_compiled"], logits["fp8select"])
        result["logits"]["fp8select_compiled_vs_transformers"] = compare(logits["fp8select_compiled"], logits["transformers"])
        if device.type == "cuda":
            # Every kernel the graphs will run compiled (and every lazily sized vendor buffer made)
            # before capture, at the sizes served here: a prefill of opt.tokens and 1-token steps.
            fp8select.warmup(ours, ms=[1, opt.tokens])
            graphed = compiled(ours, "reduce-overhead")
            for _ in range(3):  # cudagraph trees record on the second or third call
                decoded = logits_of(graphed, step)
            result["logits"]["fp8select_decode_cudagraph_vs_eager"] = compare(decoded, logits_of(ours, step))
    if opt.timing and device.type == "cuda":
        result["timing_ms"] = time_all(opt, {"bf16": (bf16, contextlib.nullcontext), "fp8select": (ours, contextlib.nullcontext),
                                             "transformers": (ref.model, ref.context)}, ids, step)
        result["timing_note"] = ("median of CUDA-event times; prefill = 1 x tokens without KV cache, compiled with the "
                                 "default mode; decode = 1 x 1 token without KV cache (every linear at M=1), compiled "
                                 "with mode='reduce-overhead' (CUDA graphs)")
    return result


def time_all(opt: Options, models: dict[str, tuple[torch.nn.Module, Callable[[], Any]]], ids: torch.Tensor,
             step: torch.Tensor) -> dict[str, dict[str, dict[str, float | str]]]:
    timing: dict[str, dict[str, dict[str, float | str]]] = {"prefill": {}, "decode": {}}
    for name, (model, context) in models.items():
        for phase, x, mode in (("prefill", ids, None), ("decode", step, "reduce-overhead")):
            row = timing[phase].setdefault(name, {})
            with context(), torch.inference_mode():
                row["eager"] = median_ms(lambda m=model, x=x: m(input_ids=x, use_cache=False), opt.reps)
                if not opt.compile:
                    continue
                try:
                    fn = compiled(model, mode)
                    row["compiled"] = median_ms(lambda fn=fn, x=x: fn(input_ids=x, use_cache=False), opt.reps)
                except Exception as exc:  # noqa: BLE001 - report a path that does not compile, keep timing the rest
                    row["compiled"] = f"failed: {type(exc).__name__}: {str(exc)[:200]}"
    return timing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", help="also write the JSON summary to this file")
    parser.add_argument("--device", default=Options.device)
    parser.add_argument("--backend", help="force an fp8select backend (default: resolve())")
    parser.add_argument("--tokens", type=int, default=Options.tokens, help="prefill length (batch 1)")
    parser.add_argument("--hidden", type=int, default=Options.hidden)
    parser.add_argument("--intermediate", type=int, default=Options.intermediate)
    parser.add_argument("--layers", type=int, default=Options.layers)
    parser.add_argument("--heads", type=int, default=Options.heads, help="attention heads (head_dim = hidden / heads)")
    parser.add_argument("--kv-heads", type=int, default=Options.kv_heads)
    parser.add_argument("--vocab", type=int, default=Options.vocab)
    parser.add_argument("--reps", type=int, default=Options.reps)
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--no-timing", action="store_true")
    args = parser.parse_args(argv)
    opt = Options(device=args.device, hidden=args.hidden, intermediate=args.intermediate, layers=args.layers, vocab=args.vocab,
                  heads=args.heads, kv_heads=args.kv_heads,
                  tokens=args.tokens, backend=args.backend, compile=not args.no_compile, timing=not args.no_timing,
                  reps=args.reps)
    text = json.dumps(run(opt), indent=2)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
