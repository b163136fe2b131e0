"""Wire codecs: bytes on the wire to and from the pipeline's OpenAI-format conversation."""
