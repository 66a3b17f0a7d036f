"""Runs localstripe_plus.py with its state in a file of its own.

localstripe writes its whole store to the fixed path /tmp/localstripe.pickle after every
change, so every instance on a machine (parallel tests, several engineers) overwrites
the same file. This launcher points the store at $LOCALSTRIPE_PICKLE instead, then runs
the script given as the first argument with the remaining arguments.

Usage: LOCALSTRIPE_PICKLE=/path/state.pickle python localstripe_isolated.py \
           path/to/localstripe_plus.py --port 8420 --from-scratch
"""
import os
import pickle
import runpy
import sys

from localstripe import resources

STATE = os.environ.get('LOCALSTRIPE_PICKLE', '')
if not STATE:
    sys.exit("localstripe_isolated.py: set LOCALSTRIPE_PICKLE to this instance's state file")
if len(sys.argv) < 2:
    sys.exit('usage: localstripe_isolated.py LOCALSTRIPE_PLUS_PY [ARGS...]')


def try_load_from_disk(self):
    try:
        with open(STATE, 'rb') as f:
            old = pickle.load(f)
    except FileNotFoundError:
        return
    self.clear()
    self.update(old)


def dump_to_disk(self):
    tmp = STATE + '.tmp'
    with open(tmp, 'wb') as f:
        pickle.dump(self, f, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, STATE)


resources.Store.try_load_from_disk = try_load_from_disk
resources.Store.dump_to_disk = dump_to_disk

script = sys.argv[1]
sys.argv = [script] + sys.argv[2:]
runpy.run_path(script, run_name='__main__')
