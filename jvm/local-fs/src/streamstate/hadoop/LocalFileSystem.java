package streamstate.hadoop;

/**
 * The {@code file:} scheme for Hadoop's {@code FileSystem} API (Spark's, Delta's): Hadoop's checksummed
 * local file system over {@link ProcessFreeRawLocalFileSystem}. Configured as {@code fs.file.impl} by
 * spark_jobs/driver/session.py.
 */
public class LocalFileSystem extends org.apache.hadoop.fs.LocalFileSystem {
  public LocalFileSystem() {
    super(new ProcessFreeRawLocalFileSystem());
  }
}
