// A JDK java.net.http.HttpClient watch loop: the JVM client of the real-cluster tier.
//
//     java JavaWatch.java --server https://HOST:PORT --ca CA.pem --token-file FILE [--namespace NS]
//                         [--resource pods|configmaps|...] [--list true|false]
//
// HTTP/2 over TLS (trusting the CA), a bearer token. Like a client-go reflector it lists the
// pods, watches from the list's resourceVersion with a random 5-10 min timeoutSeconds, and when
// the watch ends or fails, waits 1 s and lists again; the client is kept, so requests share one
// pooled HTTP/2 connection, and a lost connection is dialed again on the next request. With
// `--list false` it watches without listing first (no resourceVersion: the apiserver starts
// the watch with an ADDED event per existing object), as many hand-written operators do, and
// re-watches with a 300 s timeoutSeconds when a watch ends.
// The JVM opens AF_INET6 sockets even to IPv4 servers (::ffff:a.b.c.d).
//
// stdout: `LIST <rv> <HTTP version>`, `WATCH <HTTP version>`, one `EVENT <type>` per
// watch event, `WATCH_END` when the server ends the watch. stderr: `ERROR <exception>`.
import java.io.ByteArrayInputStream;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.KeyStore;
import java.security.cert.CertificateFactory;
import java.security.cert.X509Certificate;
import java.time.Duration;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.ThreadLocalRandom;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import javax.net.ssl.SSLContext;
import javax.net.ssl.TrustManagerFactory;

public class JavaWatch {
    private static final Pattern RV = Pattern.compile("\"resourceVersion\":\"([0-9]+)\"");
    private static final Pattern TYPE = Pattern.compile("^\\{\"type\":\"([A-Z]+)\"");

    public static void main(String[] argv) throws Exception {
        Map<String, String> args = new HashMap<>();
        args.put("--namespace", "default");
        args.put("--resource", "pods");
        args.put("--list", "true");
        for (int i = 0; i + 1 < argv.length; i += 2) {
            args.put(argv[i], argv[i + 1]);
        }
        for (String required : new String[] {"--server", "--ca", "--token-file"}) {
            if (!args.containsKey(required)) {
                System.err.println("usage: java JavaWatch.java --server URL --ca FILE --token-file FILE [--namespace NS]");
                System.exit(2);
            }
        }
        String token = Files.readString(Path.of(args.get("--token-file"))).trim();
        HttpClient http = HttpClient.newBuilder()
                .version(HttpClient.Version.HTTP_2)
                .sslContext(trusting(Path.of(args.get("--ca"))))
                .connectTimeout(Duration.ofSeconds(5))
                .build();
        String pods = args.get("--server") + "/api/v1/namespaces/" + args.get("--namespace") + "/"
                + args.get("--resource");
        boolean listFirst = !"false".equals(args.get("--list"));
        while (true) {
            try {
                if (!listFirst) {
                    watch(http, pods + "?watch=1&allowWatchBookmarks=true&timeoutSeconds=300", token);
                    continue;
                }
                HttpResponse<String> list = http.send(get(pods + "?limit=500", token), HttpResponse.BodyHandlers.ofString());
                if (list.statusCode() != 200) {
                    throw new IllegalStateException("list: HTTP " + list.statusCode() + " " + list.body());
                }
                Matcher rv = RV.matcher(list.body());
                if (!rv.find()) {
                    throw new IllegalStateException("list without resourceVersion: " + list.body());
                }
                System.out.println("LIST " + rv.group(1) + " " + list.version());
                int timeout = 300 + ThreadLocalRandom.current().nextInt(300);
                watch(http, pods + "?watch=1&allowWatchBookmarks=true&resourceVersion=" + rv.group(1)
                        + "&timeoutSeconds=" + timeout, token);
            } catch (Exception e) {
                System.err.println("ERROR " + e);
                Thread.sleep(1000);
            }
        }
    }

    /** One watch until the server ends it: `WATCH`, an `EVENT` per line, `WATCH_END`. */
    private static void watch(HttpClient http, String url, String token) throws Exception {
        HttpResponse<java.util.stream.Stream<String>> watch =
                http.send(get(url, token), HttpResponse.BodyHandlers.ofLines());
        if (watch.statusCode() != 200) {
            throw new IllegalStateException("watch: HTTP " + watch.statusCode());
        }
        System.out.println("WATCH " + watch.version());
        watch.body().forEach(line -> {
            Matcher t = TYPE.matcher(line);
            System.out.println("EVENT " + (t.find() ? t.group(1) : "?"));
        });
        System.out.println("WATCH_END");
    }

    private static HttpRequest get(String url, String token) {
        return HttpRequest.newBuilder(URI.create(url))
                .header("Authorization", "Bearer " + token)
                .header("Accept", "application/json")
                .header("User-Agent", "lifeline-java-watch/0.1")
                .GET()
                .build();
    }

    private static SSLContext trusting(Path caPem) throws Exception {
        CertificateFactory cf = CertificateFactory.getInstance("X.509");
        X509Certificate ca = (X509Certificate) cf.generateCertificate(new ByteArrayInputStream(Files.readAllBytes(caPem)));
        KeyStore store = KeyStore.getInstance(KeyStore.getDefaultType());
        store.load(null, null);
        store.setCertificateEntry("cluster-ca", ca);
        TrustManagerFactory tmf = TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
        tmf.init(store);
        SSLContext ctx = SSLContext.getInstance("TLS");
        ctx.init(null, tmf.getTrustManagers(), null);
        return ctx;
    }
}
