"""Request parsers: DRF's, hardened against hostile nesting.

Python's JSON decoder recurses once per level of nesting, so a few kilobytes
of `[[[[…` raise `RecursionError`, which DRF's parser does not catch (a 500).
"""

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser


class HermesJSONParser(JSONParser):
    """DRF's JSON parser; nesting too deep for the decoder answers 400."""

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - nested too deeply") from None
