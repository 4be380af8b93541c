"""The GPU session runner (README, "On a lent GPU"): `bash bench/gpu_session.sh`
runs `python3 bench/gpu_session/__main__.py`. plan.py: the steps and the
budget's plan (pure); steps.py: the step tables; runner.py: running them,
the summary and the logs archive; results.py: pytest's results from junit
XML and the guard's results log; side_by_side.py: a benchmark once per CUDA
codec kernel set; env_check.py, has_cuda.py, build_check.py: the env and
build steps' programs; gpu_session_guard.py: the pytest plugin of every
pytest step."""
