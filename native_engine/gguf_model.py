"""Read a Llama-architecture GGUF file into fp32 numpy weights laid out for `x @ W`."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import gguf
import numpy as np
from numpy.lib import format as npformat

from native_engine.file_cache import cache_dir, entry_name, file_identity

SUPPORTED_ARCHS = ("llama",)
# Turn-ending control tokens of common chat templates; ChatML's <|im_end|> is SmolLM2's.
STOP_TOKEN_TEXTS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>")


@dataclass
class ModelConfig:
    n_layers: int
    hidden_size: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_size: int
    vocab_size: int
    context_length: int
    rope_theta: float
    rms_eps: float
    bos_token_id: int
    eos_token_ids: list[int] = field(default_factory=list)
    name: str = ""


@dataclass
class LayerWeights:
    attn_norm: np.ndarray  # [hidden]
    wqkv: np.ndarray  # [hidden, (n_heads + 2 * n_kv_heads) * head_dim]: q, k, v columns side by side
    wo: np.ndarray  # [n_heads * head_dim, hidden]
    ffn_norm: np.ndarray  # [hidden]
    w_gate_up: np.ndarray  # [hidden, 2 * ffn]: gate columns then up columns
    w_down: np.ndarray  # [ffn, hidden]


@dataclass
class ModelWeights:
    token_embedding: np.ndarray  # [vocab, hidden]; with tied embeddings a transposed view of lm_head
    layers: list[LayerWeights]
    output_norm: np.ndarray  # [hidden]
    lm_head: np.ndarray  # [hidden, vocab], contiguous: x @ lm_head is twice as fast as x @ embedding.T
    # the file they came from (its path or its open reader): runtimes with 4-bit kernels read its Q4_1 blocks as
    # stored (gguf_q4.py)
    gguf_file: str | Path | gguf.GGUFReader | None = None

    def matrix_bytes(self) -> int:
        """Bytes one forward step reads from weights (embedding rows for the inputs are negligible)."""
        total = self.output_norm.nbytes + self.lm_head.nbytes
        for layer in self.layers:
            for array in (layer.attn_norm, layer.wqkv, layer.wo, layer.ffn_norm, layer.w_gate_up, layer.w_down):
                total += array.nbytes
        return total


def _field(reader: gguf.GGUFReader, key: str, default=None):
    found = reader.fields.get(key)
    if found is None:
        if default is None:
            raise ValueError(f"GGUF file lacks the metadata field {key!r}; it is not a complete Llama GGUF")
        return default
    return found.contents()


def read_config(reader: gguf.GGUFReader) -> ModelConfig:
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise ValueError(
            f"general.architecture is {arch!r}; native_engine runs only {', '.join(SUPPORTED_ARCHS)} "
            "models (use the llama.cpp or vLLM backend for others)"
        )
    hidden = int(_field(reader, f"{arch}.embedding_length"))
    n_heads = int(_field(reader, f"{arch}.attention.head_count"))
    n_kv_heads = int(_field(reader, f"{arch}.attention.head_count_kv", n_heads))
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = int(_field(reader, f"{arch}.vocab_size", len(tokens.data) if tokens is not None else None))
    eos = int(_field(reader, "tokenizer.ggml.eos_token_id"))
    eos_token_ids = [eos] + [i for i in stop_token_ids(reader) if i != eos]
    return ModelConfig(
        n_layers=int(_field(reader, f"{arch}.block_count")),
        hidden_size=hidden,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=int(_field(reader, f"{arch}.rope.dimension_count", hidden // n_heads)),
        ffn_size=int(_field(reader, f"{arch}.feed_forward_length")),
        vocab_size=vocab,
        context_length=int(_field(reader, f"{arch}.context_length")),
        rope_theta=float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        rms_eps=float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon")),
        bos_token_id=int(_field(reader, "tokenizer.ggml.bos_token_id")),
        eos_token_ids=eos_token_ids,
        name=str(_field(reader, "general.name", "")),
    )


def stop_token_ids(reader: gguf.GGUFReader) -> list[int]:
    """Control tokens that end a turn in chat templates, besides the declared eos token."""
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    types = reader.fields.get("tokenizer.ggml.token_type")
    if tokens is None or types is None:
        return []
    wanted = set(STOP_TOKEN_TEXTS)
    found = []
    for token_id, (text, kind) in enumerate(zip(tokens.contents(), types.contents())):
        if kind == gguf.TokenType.CONTROL and text in wanted:
            found.append(token_id)
    return found


def open_gguf(path: str | Path | gguf.GGUFReader) -> gguf.GGUFReader:
    """A parsed GGUF, shared by load_gguf and Tokenizer.from_gguf: parsing SmolLM2's 49152-token
    vocabulary takes seconds. Keyed on size and mtime, so a rewritten file is parsed again."""
    if isinstance(path, gguf.GGUFReader):
        return path
    resolved = Path(path).resolve()
    stat = resolved.stat()
    return _parsed_gguf(str(resolved), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _parsed_gguf(path: str, size: int, mtime_ns: int) -> gguf.GGUFReader:
    return gguf.GGUFReader(path)


def load_gguf(path: str | Path | gguf.GGUFReader) -> tuple[ModelConfig, ModelWeights]:
    """Config and fp32 weights of a GGUF file (or an open GGUFReader); a file of WEIGHTS_CACHED_FROM_BYTES or more
    through its copy in the user's cache (cached_weights)."""
    if isinstance(path, gguf.GGUFReader) or Path(path).stat().st_size < WEIGHTS_CACHED_FROM_BYTES:
        return read_gguf(path)
    return cached_weights(Path(path))


def read_gguf(path: str | Path | gguf.GGUFReader) -> tuple[ModelConfig, ModelWeights]:
    """Config and fp32 weights parsed and dequantized from the GGUF file itself."""
    reader = open_gguf(path)
    config = read_config(reader)
    tensors = {t.name: t for t in reader.tensors}

    def tensor(name: str) -> np.ndarray:
        """Dequantized fp32 in numpy order: [out, in] for a matrix (GGUF lists dims reversed)."""
        if name not in tensors:
            raise ValueError(f"GGUF file {path} lacks the tensor {name!r}")
        t = tensors[name]
        return np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)

    def for_x_at_w(*out_in_blocks: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(np.concatenate(out_in_blocks, axis=0).T)

    c = config
    layers = []
    for i in range(c.n_layers):
        p = f"blk.{i}."
        layers.append(
            LayerWeights(
                attn_norm=tensor(p + "attn_norm.weight"),
                # Q and K rows as llama.cpp's converter stored them: RoPE rotates adjacent pairs (2i, 2i+1)
                wqkv=for_x_at_w(tensor(p + "attn_q.weight"), tensor(p + "attn_k.weight"), tensor(p + "attn_v.weight")),
                wo=for_x_at_w(tensor(p + "attn_output.weight")),
                ffn_norm=tensor(p + "ffn_norm.weight"),
                w_gate_up=for_x_at_w(tensor(p + "ffn_gate.weight"), tensor(p + "ffn_up.weight")),
                w_down=for_x_at_w(tensor(p + "ffn_down.weight")),
            )
        )
    embedding = tensor("token_embd.weight")
    if embedding.shape != (c.vocab_size, c.hidden_size):
        raise ValueError(f"token_embd.weight has shape {embedding.shape}, expected {(c.vocab_size, c.hidden_size)}")
    if "output.weight" in tensors:
        lm_head = for_x_at_w(tensor("output.weight"))
        embedding = np.ascontiguousarray(embedding)
    else:  # tied: one copy, laid out for the lm_head matmul; lookups read it transposed
        lm_head = for_x_at_w(embedding)
        embedding = lm_head.T
    weights = ModelWeights(
        token_embedding=embedding,
        layers=layers,
        output_norm=tensor("output_norm.weight"),
        lm_head=lm_head,
        gguf_file=path,
    )
    return config, weights


# The weights as read_gguf lays them out, kept as one .npy file an array: parsing SmolLM2's GGUF (gguf's reader reads
# its 49,152-token vocabulary element by element) and dequantizing it took ~13 s a process here, in every engine a
# test, a tune trial or a quickstart starts; reading the copies takes 0.1-3.6 s. They are read into one array of the
# process's own (numpy asks huge pages for it: 524 of SmolLM2's 538 MB came in huge pages, 397 MB of the parsed
# weights' arrays did), not mapped: a decode step streams every weight, and mapped file pages (small ones) made
# single-stream steps ~10-20% slower in a side-by-side run. Files under WEIGHTS_CACHED_FROM_BYTES load in well under a
# second and are not copied. Bump the version when read_gguf's layout changes.
WEIGHTS_CACHE_VERSION = 2
WEIGHTS_CACHED_FROM_BYTES = 32 << 20
_LAYER_ARRAYS = ("attn_norm", "wqkv", "wo", "ffn_norm", "w_gate_up", "w_down")


def cached_weights(path: Path) -> tuple[ModelConfig, ModelWeights]:
    """read_gguf's result from the copy in the user's cache (file_cache.py), written there first when absent. A copy
    that cannot be written (a read-only home, a full disk) is left out."""
    identity = file_identity(path, WEIGHTS_CACHE_VERSION)
    folder = cache_dir("gguf-weights") / entry_name(identity)
    try:
        return _read_copy(folder, identity, path)
    except (OSError, ValueError, KeyError, TypeError):
        pass  # not there yet, or another layout's
    config, weights = read_gguf(path)
    try:
        _write_copy(folder, identity, path, config, weights)
    except OSError:
        pass
    return config, weights


def _read_copy(folder: Path, identity: str, path: Path) -> tuple[ModelConfig, ModelWeights]:
    doc = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    if doc["identity"] != identity:
        raise ValueError("another file's copy")
    config = ModelConfig(**doc["config"])
    array = _read_arrays(folder, doc["arrays"]).__getitem__
    layers = [
        LayerWeights(**{name: array(f"layer{i}.{name}") for name in _LAYER_ARRAYS}) for i in range(config.n_layers)
    ]
    lm_head = array("lm_head")
    embedding = lm_head.T if doc["tied"] else array("token_embedding")
    weights = ModelWeights(embedding, layers, array("output_norm"), lm_head, gguf_file=path)
    return config, weights


def _write_copy(folder: Path, identity: str, path: Path, config: ModelConfig, weights: ModelWeights) -> None:
    """Written beside the entry and renamed into place over what is there (a copy that could not be read): two
    processes may write it at once, and a reader sees a whole copy or none. Copies of earlier versions of the same
    file are removed."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    partial = folder.with_name(f"{folder.name}.{os.getpid()}.tmp")
    tied = np.may_share_memory(weights.token_embedding, weights.lm_head)
    arrays = {"lm_head": weights.lm_head, "output_norm": weights.output_norm}
    arrays |= {} if tied else {"token_embedding": weights.token_embedding}
    for i, layer in enumerate(weights.layers):
        arrays |= {f"layer{i}.{name}": getattr(layer, name) for name in _LAYER_ARRAYS}
    source = str(path.resolve())
    try:
        partial.mkdir()
        for name, values in arrays.items():
            np.save(partial / f"{name}.npy", values)
        doc = {"identity": identity, "source": source, "config": dataclasses.asdict(config), "tied": bool(tied)}
        doc["arrays"] = list(arrays)
        (partial / "config.json").write_text(json.dumps(doc), encoding="utf-8")
        shutil.rmtree(folder, ignore_errors=True)
        partial.rename(folder)
    finally:
        shutil.rmtree(partial, ignore_errors=True)  # left only when the rename did not happen
    for other in folder.parent.iterdir():
        if other != folder and _copy_source(other) == source:
            shutil.rmtree(other, ignore_errors=True)


def _read_arrays(folder: Path, names: list[str]) -> dict[str, np.ndarray]:
    """The copy's fp32 arrays, read into slices of one array (see WEIGHTS_CACHE_VERSION's comment)."""
    headers = {}
    for name in names:
        with open(folder / f"{name}.npy", "rb") as npy:
            version = npformat.read_magic(npy)
            read_header = npformat.read_array_header_1_0 if version == (1, 0) else npformat.read_array_header_2_0
            shape, fortran_order, dtype = read_header(npy)
            if dtype != np.float32 or fortran_order:
                raise ValueError(f"{name}.npy is not a C-ordered fp32 array")
            headers[name] = (shape, npy.tell())
    whole = np.empty(sum(math.prod(shape) for shape, _ in headers.values()), dtype=np.float32)
    arrays, start = {}, 0
    for name, (shape, data_at) in headers.items():
        arrays[name] = whole[start : start + math.prod(shape)].reshape(shape)
        start += math.prod(shape)
        with open(folder / f"{name}.npy", "rb") as npy:
            npy.seek(data_at)
            if npy.readinto(memoryview(arrays[name]).cast("B")) != arrays[name].nbytes:
                raise ValueError(f"{name}.npy is shorter than its header says")
    return arrays


def _copy_source(folder: Path) -> str | None:
    try:
        return json.loads((folder / "config.json").read_text(encoding="utf-8")).get("source")
    except (OSError, ValueError, AttributeError):
        return None
