"""Every file zepp writes for the user goes through here: where an output may go, how it is
written, and who may write it.

The rules (one module, every command):

- *Where* (``paths``): an output file's folder exists and accepts a new file (checked by creating
  and removing a probe, so a read-only or virtual file system such as ``/proc`` is refused), the
  path is not a folder, and the writer supports its suffix; an existing entry that is not a
  regular file (a named pipe, a device, a socket) is refused, never opened, and so is a
  symbolic link: writing through it would change the file it points to (another file of the
  user, ``/dev/stdout``, a device), and replacing it would silently undo a link the user made
  (and, as root, could replace a system link such as ``/dev/stdout`` itself). No output may be an
  input of the same run or another output of it: paths are compared after resolving ``..`` and
  symbolic links and by file identity (device and inode: hard links too), and a file may not lie
  in a folder the run reads or writes under a name that folder holds (``--record`` writes
  ``layer_*.txt`` and ``load.json``; ``--checkpoint`` is read whole). Refused with one line
  before any work.
- *How* (``atomic``): every output is written to a temporary file in the same folder, flushed to
  disk (``fsync``) and renamed over the path, so SIGINT, SIGTERM, SIGKILL, a crash or a full disk
  leave either the previous file or the new one, never a torn one; a write that fails is one line
  naming the option (nothing is reported as written). The rename replaces the directory entry:
  it never writes into what the entry pointed to.
- *Who* (``claims``): a run holds an advisory lock (``flock``) on a lock file beside each output
  (``.NAME.zepp-lock``) from its checks to its end, so a second run writing the same path is
  refused with one line naming the first one's pid; the kernel drops the lock when a process
  dies, whatever kills it, and the file itself is removed when the run ends. Temporary files a
  killed run left (``.STEM.zepp-tmp-PID-*``, PID no longer running) are removed by the next run
  that claims the same output.
"""

from __future__ import annotations

from zepp.outputs.atomic import replacing, write_bytes, write_json, write_text
from zepp.outputs.claims import claim_outputs, release_claims
from zepp.outputs.paths import OutputError, Place, check_output_file, check_output_folder

__all__ = ["OutputError", "Place", "check_output_file", "check_output_folder", "claim_outputs", "release_claims",
           "replacing", "write_bytes", "write_json", "write_text"]
