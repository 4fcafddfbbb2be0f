"""The encoder and the model folders it is read from and written to.

Owns: `bert.py` (the BERT encoder and its pretraining heads, parameter names as
transformers has them; RoBERTa's positions as a config choice), `modernbert.py` (the modern encoder, with
`unpadded.py`: its unpadded tokens' layout, rotary positions and local attention),
`families/` (BERT, RoBERTa and the modern encoder behind one interface), `config.py` (`ModelConfig`,
the published sizes and their bounds, RoBERTa's shape and names; pydantic only, no torch),
`folder.py` (a Hugging Face folder from outside the run judged on the driver from its config
and the safetensors header, no tensors loaded), `pretrained.py` (its weights mapped onto
ours), `hf_files.py` (the file names of such a folder) and `sentence_files.py` (the
sentence-transformers files of an embedding model's folder, read from a teacher and written
beside its student; JSON only).

May import: torch (bert.py, modernbert.py, unpadded.py, pretrained.py only; a family names its
model class as a string), safetensors, pydantic, and bertcore's
top-level helpers (errors, section). Must not import: ray, prefect, deepspeed, or any other
bertcore component; this package's __init__ imports nothing, so reading a recipe stays light.
"""
