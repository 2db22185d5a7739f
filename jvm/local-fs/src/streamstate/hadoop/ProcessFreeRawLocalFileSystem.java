package streamstate.hadoop;

import java.io.FileNotFoundException;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;

import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsAction;
import org.apache.hadoop.fs.permission.FsPermission;

/**
 * Hadoop's raw local file system without a process per call.
 *
 * <p>Without Hadoop's native library (not shipped with pyspark), {@link RawLocalFileSystem} runs {@code chmod}
 * for every file and directory it creates and {@code readlink} twice for every {@code FileContext} rename:
 * about 40 processes forked by the Spark JVM per micro-batch of a small job (the offset and commit logs, the
 * state stores' changelog files), 20 of them on the micro-batch's own thread. Java's file API does both in
 * process. Everything else is Hadoop's.
 */
public class ProcessFreeRawLocalFileSystem extends RawLocalFileSystem {
  /** {@code chmod} through Java's POSIX file attributes (the sticky and set-id bits, which Hadoop's files never
   * carry and Java cannot set, go to Hadoop's own {@code chmod}). */
  @Override
  public void setPermission(Path p, FsPermission permission) throws IOException {
    if (permission.getStickyBit() || (permission.toShort() & ~0777) != 0) {
      super.setPermission(p, permission);
      return;
    }
    Set<PosixFilePermission> posix = EnumSet.noneOf(PosixFilePermission.class);
    add(posix, permission.getUserAction(), PosixFilePermission.OWNER_READ, PosixFilePermission.OWNER_WRITE,
        PosixFilePermission.OWNER_EXECUTE);
    add(posix, permission.getGroupAction(), PosixFilePermission.GROUP_READ, PosixFilePermission.GROUP_WRITE,
        PosixFilePermission.GROUP_EXECUTE);
    add(posix, permission.getOtherAction(), PosixFilePermission.OTHERS_READ, PosixFilePermission.OTHERS_WRITE,
        PosixFilePermission.OTHERS_EXECUTE);
    try {
      Files.setPosixFilePermissions(pathToFile(p).toPath(), posix);
    } catch (NoSuchFileException e) {
      throw new FileNotFoundException("File " + p + " does not exist");
    }
  }

  private static void add(Set<PosixFilePermission> posix, FsAction action, PosixFilePermission read,
      PosixFilePermission write, PosixFilePermission execute) {
    if (action.implies(FsAction.READ)) {
      posix.add(read);
    }
    if (action.implies(FsAction.WRITE)) {
      posix.add(write);
    }
    if (action.implies(FsAction.EXECUTE)) {
      posix.add(execute);
    }
  }

  /** A path that is no symbolic link has the status of the file (what Hadoop returns after asking
   * {@code readlink}); a symbolic link is left to Hadoop. */
  @Override
  public FileStatus getFileLinkStatus(Path f) throws IOException {
    if (Files.isSymbolicLink(pathToFile(f).toPath())) {
      return super.getFileLinkStatus(f);
    }
    return getFileStatus(f);
  }
}
