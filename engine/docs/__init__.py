"""Chat with your documents: readers, chunking, the SQLite index, embedders, hybrid retrieval and citations.

No Qt and no torch: the app runs indexing in the engine's thread pool, and ``python -m engine.docs`` serves scripts.
"""
