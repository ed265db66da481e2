"""Consumer modules that tests run in a subprocess (``wakuwaku run module:attr``)."""
