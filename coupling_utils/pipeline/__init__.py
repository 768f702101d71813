"""The book machinery: notebook parameters, papermill execution, reproduction status,
the book build and the command line."""
