"""Bridges to other libraries. Each submodule imports its library lazily (only when used).

* ``attnlab.integrations.transformers``: ``register()`` makes ``attn_implementation="attnlab"``
  run every attention of a Hugging Face model through ``attnlab.attention``, with HF's masks
  turned into attnlab's structured masks.
"""
