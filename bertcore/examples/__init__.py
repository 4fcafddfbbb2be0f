"""Training sequences from documents, as the examples stage writes them.

Owns: `config.py` (the `examples:` section: objective, phases, pair and masking settings,
length bins; pydantic only), `pairs.py` (NSP and SOP pairs as Google's
create_pretraining_data builds them, and RoBERTa's packed sentences), `masking.py` (which
positions to predict and what the model sees there, static or dynamic), `vocab_tables.py`
(a vocabulary's special ids and layout, BERT's or RoBERTa's, and its word starts),
`layout.py` (the shard record layout, and documents -> records), `arrow.py` (numpy <->
Arrow columns) and `decode.py` (records printed as text).

May import: numpy, pyarrow, torch (masking's dynamic path only), and bertcore's top-level
helpers (rng, section, errors). Must not import: ray, prefect, deepspeed, or the train,
model and eval components; the vocabulary reaches it as token ids, not as a tokenizer.
"""
