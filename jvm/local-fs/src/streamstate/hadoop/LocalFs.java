package streamstate.hadoop;

import java.io.IOException;
import java.net.URI;
import java.net.URISyntaxException;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.ChecksumFs;
import org.apache.hadoop.fs.DelegateToFileSystem;
import org.apache.hadoop.fs.FsConstants;
import org.apache.hadoop.fs.FsServerDefaults;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.local.LocalConfigKeys;

/**
 * The {@code file:} scheme for Hadoop's {@code FileContext} API (Spark's checkpoint files, Delta's log):
 * Hadoop's {@code LocalFs} (checksummed, over {@code RawLocalFs}) with {@link ProcessFreeRawLocalFileSystem}
 * underneath. Configured as {@code fs.AbstractFileSystem.file.impl} by spark_jobs/driver/session.py.
 */
public class LocalFs extends ChecksumFs {
  public LocalFs(URI uri, Configuration conf) throws IOException, URISyntaxException {
    super(new RawLocalFs(uri, conf));
  }

  /** Hadoop's {@code RawLocalFs}, whose constructor builds its own raw file system. */
  static final class RawLocalFs extends DelegateToFileSystem {
    RawLocalFs(URI uri, Configuration conf) throws IOException, URISyntaxException {
      super(uri, new ProcessFreeRawLocalFileSystem(), conf, FsConstants.LOCAL_FS_URI.getScheme(), false);
    }

    @Override
    public int getUriDefaultPort() {
      return -1; // no default port for file:///
    }

    @Override
    @Deprecated
    public FsServerDefaults getServerDefaults() throws IOException {
      return LocalConfigKeys.getServerDefaults();
    }

    @Override
    public FsServerDefaults getServerDefaults(Path f) throws IOException {
      return LocalConfigKeys.getServerDefaults();
    }

    @Override
    public boolean isValidName(String src) {
      return true; // any path the local file system accepts
    }
  }
}
