package dev.loopline.streams;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.HexFormat;

import com.google.gson.Gson;

/**
 * Drives the job's {@link EventContract} for {@code tests/streams/test_event_contract.py}: one command per line on
 * standard input, one answer line per decode.
 * <ul>
 *   <li>{@code contract <spec>}: the contract to decode with ({@code EventContract.jvm_spec}, JSON on one line);
 *   <li>{@code decode <json|avro> <payload in hex>}: answers {@code ok <the values as a JSON array>} or
 *       {@code invalid <field>}.
 * </ul>
 */
public final class ContractReplay {
    private ContractReplay() {}

    public static void main(String[] args) throws IOException {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        PrintStream out = new PrintStream(System.out, true, StandardCharsets.UTF_8);
        Gson gson = new Gson();
        EventContract contract = null;
        for (String line = in.readLine(); line != null; line = in.readLine()) {
            String[] part = line.split(" ", 3);
            if (part[0].equals("contract")) {
                contract = new EventContract(line.substring("contract ".length()));
                continue;
            }
            byte[] payload = part.length > 2 ? HexFormat.of().parseHex(part[2]) : new byte[0];
            try {
                out.println("ok " + gson.toJson(contract.decode(payload, part[1].equals("avro"))));
            } catch (EventContract.Violation violation) {
                out.println("invalid " + violation.field);
            }
        }
    }
}
