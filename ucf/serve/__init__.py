"""``ucf serve``: a local page to write a statement, pick formats and a schedule, read
the code every stage prints, picture the operands' storage and run the kernel.

The page compiles and runs what a browser sends, so the server is built to be
safe by default: it binds the loopback address, answers only requests whose Host
and Origin are its own (``ucf.serve.guard``), bounds every request's size
(``ucf.serve.limits``), and compiles and runs in a worker process that is killed
past its time limit (``ucf.serve.worker``). It never opens a path a request names.

Modules: ``command`` (the CLI), ``app`` (routes), ``guard``, ``limits``,
``worker``, ``jobs`` (what the worker runs), ``reference`` (numpy and scipy
results to check and time runs against), ``carets`` (errors pointed at the text)
and ``static/`` (the page, served by the server itself).
"""
