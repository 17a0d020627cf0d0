"""The LMDB cache: its on-disk format (format.py), shared by the writer (fastdata-convert)
and the reader (fastdata.sources.lmdb)."""
