"""An Anthropic Messages client, an OpenAI-compatible model behind: the pipeline's chat
form of the client's request -> a chat request that upstream takes, and its answers,
streams and errors -> Messages answers, events and errors. No I/O.

- ``request``: ``openai_request``, without what only Anthropic understands;
- ``answers``: a completion -> a Messages answer (``message_of``, ``answer_id``), an
  upstream error -> Anthropic's envelope (``error_from_openai``);
- ``stream``: chunks -> Messages server-sent events (``EventTranslator``).
"""

from gateway.codecs.messages_openai.answers import answer_id, error_from_openai, message_of
from gateway.codecs.messages_openai.request import openai_request
from gateway.codecs.messages_openai.stream import EventTranslator

__all__ = ["EventTranslator", "answer_id", "error_from_openai", "message_of", "openai_request"]
