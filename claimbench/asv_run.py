"""`asv run` reading its own machine file: `python -m claimbench.asv_run MACHINE_FILE [asv run options]`.

asv's run command loads ~/.asv-machine.json and writes it back in place before it benchmarks; two
runs on one host (a local fleet's nodes) then read each other's half-written file as empty JSON and
stop. asv's Run takes the file's path as an argument (`_machine_file`) that its command line does
not expose; this passes it, so each claimbench run reads and writes a file no other run touches.
"""
import os
import sys

from asv import commands, config, util
from asv.commands.run import Run
from asv.console import log
from asv.plugin_manager import plugin_manager


def main(argv: list[str]) -> int:
    machine_file, *run_options = argv
    parser, _ = commands.make_argparser()
    args = parser.parse_args(["run", *run_options])
    log.enable(args.verbose)
    if args.config:  # as asv's own entry point: the config's folder is the working folder
        args.config = os.path.abspath(args.config)
        os.chdir(os.path.dirname(args.config))
    try:
        conf = config.Config.load(args.config)
        for plugin in conf.plugins:
            plugin_manager.import_plugin(plugin)
        return Run.run_from_conf_args(conf, args, _machine_file=machine_file) or 0
    except util.UserError as e:
        log.error(str(e))
        return 1
    finally:
        log.flush()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
