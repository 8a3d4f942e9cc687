"""The output side: the Markdown report (:mod:`.markdown`), the HTML pages (:mod:`.html`: report.html and
``opprof compare``'s page) and the Chrome/Perfetto trace (:mod:`.trace`)."""
