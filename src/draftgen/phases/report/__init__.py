"""The report phase: ``html`` (the self-contained ``report.html`` page, built from ``runview.metrics``'
figures; ``template`` holds its markup) and ``run`` (``run_report``, which writes the page). The figures
themselves are ``draftgen.runview``'s, which ``status`` and ``plan`` read too."""
