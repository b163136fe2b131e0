"""Wire codecs: bytes on the wire to and from the pipeline's OpenAI-format conversation,
one module or package per (client API, backend API) pair, as pure data (no I/O).

- ``openai``: checking an OpenAI chat request (an OpenAI client, an OpenAI-compatible
  model: nothing else to translate); ``json_body``: reading a JSON body, naming values;
- ``chat_anthropic``: an OpenAI chat client, Claude behind;
- ``messages``: an Anthropic Messages client <-> the pipeline's chat form (Claude behind
  needs nothing more);
- ``messages_openai``: a Messages client, an OpenAI-compatible model behind;
- ``anthropic_envelopes``: Anthropic's error body and stream events, which several pairs
  and the HTTP layer write.
"""
