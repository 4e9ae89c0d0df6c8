"""Documents in the chat: the app's seam to ``engine.docs`` (indexing, retrieval, citations), no widgets."""
