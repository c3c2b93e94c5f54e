"""The data: parallel corpora (`corpora.load_corpus`, the LibreOffice corpora from Debian's packages in
`libreoffice`), the shared BPE tokenizer (`tokenizer`), and token-budget batches by length (`batching`, §5.1)."""
