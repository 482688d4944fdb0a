// The console's JSON API: answers, or an ApiError carrying the message that says what to do.

export class ApiError extends Error {
  constructor(status, message, kind) {
    super(message);
    this.status = status;
    this.kind = kind;
  }
}

async function answer(response) {
  let body = null;
  try {
    body = await response.json();
  } catch {
    throw new ApiError(response.status, `the console answered ${response.status} without JSON: is it still running?`, "BadAnswer");
  }
  if (!response.ok) throw new ApiError(response.status, body.error, body.kind);
  return body;
}

async function request(path, init) {
  let response;
  try {
    response = await fetch(path, init);
  } catch {
    throw new ApiError(0, "the console does not answer: is `gms console` still running?", "Unreachable");
  }
  return answer(response);
}

export function get(path) {
  return request(path, { headers: { Accept: "application/json" } });
}

export function post(path, body) {
  return request(path, {
    method: "POST",
    headers: { "Content-Type": "application/json", Accept: "application/json" },
    body: JSON.stringify(body),
  });
}
