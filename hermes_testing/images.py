"""Small real images for tests of attachments, made without an imaging library."""

import struct
import zlib


def png(width: int = 48, height: int = 32) -> bytes:
    """A valid RGB PNG of a diagonal colour gradient."""
    rows = b"".join(
        b"\x00"
        + b"".join(
            bytes((x * 255 // width, y * 255 // height, 160)) for x in range(width)
        )
        for y in range(height)
    )

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


# The first bytes of the other image types taken (enough for their check).
JPEG = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + b"\x00" * 32
GIF = b"GIF89a\x01\x00\x01\x00\x00\x00\x00;"
WEBP = b"RIFF\x1a\x00\x00\x00WEBPVP8 " + b"\x00" * 16
