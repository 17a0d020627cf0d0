"""The LMDB cache: its on-disk format (format.py) and the file checks made before LMDB maps
it (lmdb_file.py), shared by the reader (fastdata.sources.lmdb) and the writer behind
fastdata-convert: scan.py (what to convert), records.py (what to store per input),
writer.py (worker pool, LMDB transactions), resume_state.py (progress records, --resume),
progress_line.py (status line), verify.py (--verify)."""
