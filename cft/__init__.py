"""cft's programs: the command line (`cft`), the API process (`cft serve`), `cft run` and the
local CPU engine (`cft engine`). Background workers live in `workers/`, the domain in `app/`."""
