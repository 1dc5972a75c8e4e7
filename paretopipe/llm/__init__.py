"""Decoder-only language models, split at layer boundaries: named shapes of real small models
(``shapes``), their parts built with portable deterministic weights or from a local folder
(``build``), a tokenizer (``tokens``), a stage that keeps the KV cache of its own layers
(``stage``), and generation, unsplit or through in-process stages (``generate``)."""
