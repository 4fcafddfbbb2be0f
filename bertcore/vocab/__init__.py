"""The vocabulary: WordPiece (BERT) or byte-level BPE (RoBERTa), trained on the corpus or
adopted from a model folder.

Owns: `tokenizer.py` (Google's BasicTokenizer rules with Hangul kept whole, WordPiece
training through Hugging Face tokenizers, the vocab.txt / tokenizer.json files and their
checks), `bpe.py` (RoBERTa's byte-level BPE: training, vocab.json / merges.txt, a
document's sentences as running text), `morphemes.py` (Korean morphemes before WordPiece,
`vocab.pre_tokenizer`, and the one function every reader of a vocabulary splits text
through), `adopt.py` (an existing BERT or RoBERTa vocabulary taken as it is) and
`config.py` (the `vocab:` section; pydantic only).

May import: tokenizers, the morphological analysers kiwipiepy and mecab (inside the
functions that use them), and bertcore's top-level helpers (errors, section). Must not
import: torch, ray, prefect, or the model, train, examples and eval components.
"""
