"""Building a cache (the library behind fastdata-convert): scan.py (what to convert),
records.py (what to store per input), ordered_pool.py (the worker processes, results in input
order), writer.py (LMDB transactions, convert()), resume_state.py (progress records,
--resume), progress_line.py (status line), verify.py (--verify). A layer above
fastdata.cache's format: it decodes (fastdata.io) and reads folders and caches
(fastdata.sources)."""
