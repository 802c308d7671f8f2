#!/usr/bin/env python3
"""Plants one deliberate durability bug in src/disk (scripts/durability_bug_hunt.sh runs the
power-cut and kill -9 tests against each and reverts it). Usage: plant_durability_bug.py BUG
with BUG one of: gap_mkdir, gap_data (the two directory-fsync gaps of issue 25, reopened),
journal_before_data, slot_reuse, rename_unsynced_tmp, rename_no_dir_fsync, torn_tail_kept."""
import sys
bug=sys.argv[1]
def rep(path, old, new):
    s=open(path).read()
    assert old in s, (bug, old)
    open(path,'w').write(s.replace(old,new,1))
import os
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
R = ROOT + '/src/disk/disk_store_recovery.cpp'
S = ROOT + '/src/disk/disk_store.cpp'
F = ROOT + '/src/disk/file.cpp'
if bug=='gap_mkdir':
    rep(R,'if (Status s = fsync_dir(fs_, parent_dir(config_.directory)); !s) return s;','')
elif bug=='gap_data':
    rep(R,'''  if (data_missing) {
    if (Status s = fsync_dir(fs_, config_.directory); !s) return s;
  }''','  (void)data_missing;')
elif bug=='journal_before_data':
    rep(S,'''  if (Status s = fdatasync_fd(fs_, files_->data.get(), "fdatasync of data"); !s) {
    return disable(s.message());
  }
''','')
    rep(S,'''  journal_end_ += batch_.size();''','''  if (Status s = fdatasync_fd(fs_, files_->data.get(), "fdatasync of data"); !s) {
    return disable(s.message());
  }
  journal_end_ += batch_.size();''')
elif bug=='slot_reuse':
    rep(S,'''    slot_state_[s.value()] = SlotState::kFreeing;
    freeing_.push_back(s);''','''    slot_state_[s.value()] = SlotState::kFree;
    free_.push_back(s);''')
elif bug=='rename_unsynced_tmp':
    rep(F,'''  if (Status s = fdatasync_fd(fs, fd->get(), name.c_str()); !s) return s;
  fd->reset();''','''  fd->reset();''')
elif bug=='rename_no_dir_fsync':
    rep(F,'''    return io_error(errno, "rename into place");
  }
  return fsync_dir(fs, dir);''','''    return io_error(errno, "rename into place");
  }
  return Status::ok();''')
elif bug=='torn_tail_kept':
    rep(R,'''  if (recovery_.torn_tail_bytes > 0) {''','''  if (false) {''')
else:
    raise SystemExit('unknown bug')
