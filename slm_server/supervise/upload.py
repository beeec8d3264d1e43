"""A multipart/form-data request body with one file, and the short silent WAV that is
a transcription model's canary. Pure.

    Upload(fields, "file", "canary.wav", "audio/wav", silent_wav()).encode()
        -> ("multipart/form-data; boundary=...", body)
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

# Never in the parts: their names and values are ours, and the file is all zero bytes.
BOUNDARY: Final = "slm-canary-3f9c2e7a51d04b8e"
SAMPLE_RATE: Final = 16_000  # what Whisper resamples everything to


def silent_wav(seconds: float = 0.25, rate: int = SAMPLE_RATE) -> bytes:
    """``seconds`` of silence as a mono 16-bit PCM WAV file."""
    data = b"\x00\x00" * int(seconds * rate)
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate * 2, 2, 16)  # PCM, mono, 16-bit
    return b"".join(
        [
            b"RIFF",
            struct.pack("<I", 4 + 8 + len(fmt) + 8 + len(data)),
            b"WAVE",
            b"fmt ",
            struct.pack("<I", len(fmt)),
            fmt,
            b"data",
            struct.pack("<I", len(data)),
            data,
        ]
    )


@dataclass(frozen=True)
class Upload:
    """Text ``fields`` (names and values ASCII, no quotes) and one file."""

    fields: tuple[tuple[str, str], ...]
    file_field: str
    filename: str
    content_type: str
    content: bytes

    def encode(self) -> tuple[str, bytes]:
        """(the Content-Type header's value, the body)."""
        dash = f"--{BOUNDARY}".encode()
        parts: list[bytes] = []
        for name, value in self.fields:
            parts += [
                dash,
                b"\r\n",
                f'Content-Disposition: form-data; name="{name}"\r\n\r\n'.encode(),
                value.encode(),
                b"\r\n",
            ]
        parts += [
            dash,
            b"\r\n",
            (
                f'Content-Disposition: form-data; name="{self.file_field}"; '
                f'filename="{self.filename}"\r\n'
                f"Content-Type: {self.content_type}\r\n\r\n"
            ).encode(),
            self.content,
            b"\r\n",
            dash,
            b"--\r\n",
        ]
        return f"multipart/form-data; boundary={BOUNDARY}", b"".join(parts)
