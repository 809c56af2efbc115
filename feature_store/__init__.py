"""The Feast feature repository (``repo/``: entities, feature views and stream feature views with their aggregations
and declared defaults), its configuration with the stack's addresses, and the online store's fast read and batched
write paths in Feast's own Redis layout."""
