"""The data: parallel corpora (`corpora.load_corpus`, the LibreOffice corpora from Debian's packages in
`libreoffice`), the shared BPE tokenizer (`tokenizer`), token-budget batches by length (`batching`, §5.1), and the
bounds of what a translation reads (`translation_bounds`)."""
