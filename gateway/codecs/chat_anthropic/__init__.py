"""An OpenAI chat client, Claude behind: OpenAI chat <-> Anthropic Messages, as plain data
(issue 6, the codec part).

``to_messages`` turns an OpenAI chat completions request into a Messages API request;
``from_message`` turns a Messages API answer into a chat completion; ``Accumulator`` builds
that answer from the Messages stream's events, and ``ChunkTranslator`` turns the same
events into OpenAI stream chunks as they arrive. No I/O here: the provider that speaks to
Anthropic (and the inbound ``/v1/messages`` route) are built on these.

- ``request``: the request and the mapping of its fields, tools, tool choice, thinking;
- ``blocks``: content parts <-> Messages blocks, and where cache markers land;
- ``answers``: Messages answers, streams and errors -> chat completions, chunks, errors;
- ``thinking``: the thinking-binding beta, for requests that send thinking back.
"""

from gateway.codecs.chat_anthropic.answers import (
    Accumulator,
    ChunkTranslator,
    from_message,
    openai_error,
    usage_of,
)
from gateway.codecs.chat_anthropic.blocks import (
    OPENAI_PARTS,
    TOOL_RESULT_KEYS,
    TOOL_USE_KEYS,
    image_block,
)
from gateway.codecs.chat_anthropic.request import anthropic_tool, to_messages
from gateway.codecs.chat_anthropic.thinking import (
    THINKING_BINDING_BETA,
    sends_thinking,
    unbinding,
    with_beta,
)

__all__ = [
    "OPENAI_PARTS",
    "THINKING_BINDING_BETA",
    "TOOL_RESULT_KEYS",
    "TOOL_USE_KEYS",
    "Accumulator",
    "ChunkTranslator",
    "anthropic_tool",
    "from_message",
    "image_block",
    "openai_error",
    "sends_thinking",
    "to_messages",
    "unbinding",
    "usage_of",
    "with_beta",
]
