"""The vocabulary: WordPiece trained on the corpus or adopted from a model folder.

Owns: `tokenizer.py` (Google's BasicTokenizer rules with Hangul kept whole, WordPiece
training through Hugging Face tokenizers, the vocab.txt / tokenizer.json files and their
checks), `adopt.py` (an existing BERT vocabulary taken as it is) and `config.py` (the
`vocab:` section; pydantic only).

May import: tokenizers, and bertcore's top-level helpers (errors, section). Must not
import: torch, ray, prefect, or the model, train, examples and eval components.
"""
