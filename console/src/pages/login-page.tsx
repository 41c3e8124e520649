/**
 * Shown when the API answers 401: on `forkd console`, log in again with the URL it printed; on the
 * daemon's own listener, log in with an API token (POST /v1/console/session).
 */
import { useState } from "preact/hooks";
import { login } from "../api/session";
import { useAction } from "../lib/use-action";
import { StatusLine } from "../components/status-line";

export function LoginPage({ onLogin }: { onLogin: () => void }) {
  const [token, setToken] = useState("");
  const action = useAction();
  return (
    <section class="login" aria-labelledby="login-h">
      <h1 id="login-h">Log in</h1>
      <p>
        Started with <code>forkd console</code>? Open the login URL it printed (each URL works once; press
        Enter where it runs for another).
      </p>
      <form
        onSubmit={(e) => {
          e.preventDefault();
          void action.run("log in", async () => {
            await login(token);
            setToken("");
            onLogin();
            return "logged in";
          });
        }}
      >
        <label>
          API token
          <input
            type="password"
            autoComplete="off"
            value={token}
            onInput={(e) => setToken(e.currentTarget.value)}
          />
        </label>
        <button type="submit" disabled={action.busy || token === ""}>
          Log in
        </button>
      </form>
      <StatusLine action={action} />
    </section>
  );
}
