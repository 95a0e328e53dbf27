"""Images in chat prompts (workload.images): synthetic ones drawn from the scenario's seed, or a folder's real ones,
each sent as an OpenAI chat content part holding a base64 data URL, all built with the schedule, before t0.

The request shape is vLLM's `random-mm` benchmark dataset's (vllm-project/vllm, commit 0056b87f):
`vllm/benchmarks/datasets.py` `RandomMultiModalDataset.generate_synthetic_image` draws every pixel uniformly and
independently ("worst-case compression (good for stressing I/O)"), and `vllm/benchmarks/dataset_utils.py`
(commit 5c92be24) `process_image` sends each as `{"type": "image_url", "image_url": {"url":
"data:image/jpeg;base64,..."}}`, `apply_multimodal_chat_transformation` puts them after a `{"type": "text"}` part in
one user message. OpenAI's chat API takes the same part (`image_url.url`: a URL or a base64 data URL).

Pillow is not installed here, so PNG is written by hand (signature, IHDR, one zlib IDAT, IEND: the PNG
specification, W3C, sections 5 and 11); JPEG needs Pillow and says so where the run starts.
"""

from __future__ import annotations

import base64
import io
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.scenario.scenario import ImagesConfig, ScenarioError

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
# JPEG start-of-frame markers carry the height and width; C4 (Huffman tables), C8 and CC (arithmetic coding) do not
JPEG_SOF = set(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


@dataclass(frozen=True)
class EncodedImage:
    """One image as the request carries it: its file bytes and what they are."""

    mime: str  # image/png | image/jpeg
    data: bytes
    width: int
    height: int

    def content_part(self) -> dict:
        url = f"data:{self.mime};base64,{base64.b64encode(self.data).decode()}"
        return {"type": "image_url", "image_url": {"url": url}}


def add_images(requests: list, images: ImagesConfig, seed: int) -> None:
    """Turns the prompt of `share` of the requests (drawn from their own seeded stream, so prompts and times stay
    those of the scenario without images) into one user message: a text part, then `count` image parts. Each
    request gets its own synthetic images (an engine's image cache cannot serve a repeat); a folder's images are
    taken in a seeded order, round and round."""
    carries = np.random.default_rng([seed, 23]).random(len(requests)) < images.share
    pixel_rng = np.random.default_rng([seed, 24])
    folder = _folder_images(images.folder) if images.folder else None
    order = np.random.default_rng([seed, 25]).permutation(len(folder)) if folder else None
    taken = 0
    for spec, carry in zip(requests, carries):
        spec.image_count, spec.image_bytes = 0, 0
        if not carry:
            continue
        if folder is not None:
            picked = [folder[order[(taken + k) % len(folder)]] for k in range(images.count)]
            taken += images.count
        else:
            picked = [
                synthetic_image(pixel_rng, images.width, images.height, images.format) for _ in range(images.count)
            ]
        parts = [{"type": "text", "text": spec.prompt or ""}] + [image.content_part() for image in picked]
        spec.messages = [{"role": "user", "content": parts}]
        spec.image_count = len(picked)
        spec.image_bytes = sum(len(image.data) for image in picked)


def synthetic_image(rng: np.random.Generator, width: int, height: int, image_format: str) -> EncodedImage:
    """Uniform random RGB pixels (vLLM random-mm's), encoded as `image_format`."""
    pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    if image_format == "png":
        return EncodedImage("image/png", png_bytes(pixels), width, height)
    return EncodedImage("image/jpeg", jpeg_bytes(pixels), width, height)


def png_bytes(pixels: np.ndarray) -> bytes:
    """An 8-bit RGB PNG of an (height, width, 3) array: every row behind filter byte 0 (none), one IDAT."""
    height, width, _ = pixels.shape
    rows = np.concatenate([np.zeros((height, 1), np.uint8), pixels.reshape(height, width * 3)], axis=1)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # depth 8, colour type 2 (RGB), no interlace
    return PNG_SIGNATURE + _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(rows.tobytes(), 6)) + _chunk(b"IEND")


def _chunk(kind: bytes, data: bytes = b"") -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def jpeg_bytes(pixels: np.ndarray) -> bytes:
    try:
        from PIL import Image
    except ImportError:
        raise ScenarioError(
            "workload.images.format: jpeg needs Pillow to encode (pip install pillow), which is not installed here; "
            "use format: png"
        ) from None
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG")  # vLLM's process_image saves with Pillow's defaults
    return out.getvalue()


def image_size(data: bytes) -> tuple[str, int, int] | None:
    """(mime, width, height) from a PNG's IHDR or a JPEG's start-of-frame header; None for anything else."""
    if data.startswith(PNG_SIGNATURE) and data[12:16] == b"IHDR" and len(data) >= 24:
        width, height = struct.unpack(">II", data[16:24])
        return "image/png", width, height
    if not data.startswith(b"\xff\xd8"):
        return None
    at = 2
    while at + 9 <= len(data) and data[at] == 0xFF:
        marker = data[at + 1]
        if marker == 0xFF:  # a fill byte before the marker
            at += 1
            continue
        if marker in JPEG_SOF:
            height, width = struct.unpack(">HH", data[at + 5 : at + 9])
            return "image/jpeg", width, height
        at += 2 + struct.unpack(">H", data[at + 2 : at + 4])[0]
    return None


def _folder_images(folder: str) -> list[EncodedImage]:
    """The folder's .png / .jpg / .jpeg files in name order, each read whole and checked to be what its header says."""
    images = []
    for path in sorted(p for p in Path(folder).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file()):
        data = path.read_bytes()
        size = image_size(data)
        if size is None:
            raise ScenarioError(f"workload.images.folder: {path} is not a PNG or JPEG image; remove it from the folder")
        images.append(EncodedImage(size[0], data, size[1], size[2]))
    if not images:
        raise ScenarioError(f"workload.images.folder: {folder} holds no .png, .jpg or .jpeg images; add some")
    return images
