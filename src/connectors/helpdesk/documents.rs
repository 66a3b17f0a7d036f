//! The GraphQL documents the helpdesk connector sends to Plain, checked against Plain's
//! schema (`shared/plain/schema.graphql`) by the Plain fake in the integration tests.

/// A thread with its customer, labels, assignee and the latest timeline entries.
pub const GET_THREAD: &str = r#"query ThreadgateGetThread($threadId: ID!, $last: Int!) {
  thread(threadId: $threadId) {
    id
    ref
    title
    description
    status
    priority
    createdAt { iso8601 }
    customer { id fullName email { email isVerified } }
    labels { id labelType { id name } }
    assignedTo {
      __typename
      ... on User { id fullName }
      ... on MachineUser { id fullName }
    }
    timelineEntries(last: $last) {
      pageInfo { hasPreviousPage }
      edges {
        node {
          id
          timestamp { iso8601 }
          actor { __typename }
          entry {
            __typename
            ... on NoteEntry { noteId noteText: text markdown }
            ... on ChatEntry { chatId chatText: text }
            ... on EmailEntry { emailId subject textContent from { email name } }
          }
        }
      }
    }
  }
}"#;

/// The customer of a thread.
pub const THREAD_CUSTOMER: &str = r#"query ThreadgateThreadCustomer($threadId: ID!) {
  thread(threadId: $threadId) {
    id
    customer { id email { email } }
  }
}"#;

/// One page of a thread's notes, oldest first.
pub const THREAD_NOTES: &str = r#"query ThreadgateThreadNotes($threadId: ID!, $first: Int!, $after: String) {
  thread(threadId: $threadId) {
    timelineEntries(first: $first, after: $after, filters: { entryTypes: [NOTE] }) {
      pageInfo { hasNextPage endCursor }
      edges {
        node {
          entry {
            __typename
            ... on NoteEntry { noteId text markdown }
          }
        }
      }
    }
  }
}"#;

/// The selection every mutation asks for on its `error`.
macro_rules! mutation_error {
    () => {
        "error { message type code fields { field message type } }"
    };
}

/// A reply to the customer on the thread's channel.
pub const REPLY_TO_THREAD: &str = concat!(
    "mutation ThreadgateReplyToThread($input: ReplyToThreadInput!) {\n",
    "  replyToThread(input: $input) { ",
    mutation_error!(),
    " }\n}"
);

/// An internal note on the thread.
pub const CREATE_NOTE: &str = concat!(
    "mutation ThreadgateCreateNote($input: CreateNoteInput!) {\n",
    "  createNote(input: $input) { note { id } ",
    mutation_error!(),
    " }\n}"
);

/// Labels added to the thread (routing on escalation).
pub const ADD_LABELS: &str = concat!(
    "mutation ThreadgateAddLabels($input: AddLabelsInput!) {\n",
    "  addLabels(input: $input) { labels { id labelType { id name } } ",
    mutation_error!(),
    " }\n}"
);

/// The thread assigned to a user (routing on escalation).
pub const ASSIGN_THREAD: &str = concat!(
    "mutation ThreadgateAssignThread($input: AssignThreadInput!) {\n",
    "  assignThread(input: $input) { thread { id } ",
    mutation_error!(),
    " }\n}"
);

/// The thread moved along its workspace escalation path (routing on escalation).
pub const ESCALATE_THREAD: &str = concat!(
    "mutation ThreadgateEscalateThread($input: EscalateThreadInput!) {\n",
    "  escalateThread(input: $input) { thread { id } ",
    mutation_error!(),
    " }\n}"
);

/// The thread marked as done.
pub const MARK_THREAD_AS_DONE: &str = concat!(
    "mutation ThreadgateMarkThreadAsDone($input: MarkThreadAsDoneInput!) {\n",
    "  markThreadAsDone(input: $input) { thread { id status } ",
    mutation_error!(),
    " }\n}"
);

/// An event on the thread's timeline (a held call's trail), with an external id Plain
/// takes once.
pub const CREATE_THREAD_EVENT: &str = concat!(
    "mutation ThreadgateCreateThreadEvent($input: CreateThreadEventInput!) {\n",
    "  createThreadEvent(input: $input) { threadEvent { id } ",
    mutation_error!(),
    " }\n}"
);

/// A label type, to check at start that a configured id is one Plain knows.
pub const LABEL_TYPE: &str = r#"query ThreadgateLabelType($labelTypeId: ID!) {
  labelType(labelTypeId: $labelTypeId) { id name isArchived }
}"#;

/// The labels on a thread, with their label types.
pub const THREAD_LABELS: &str = r#"query ThreadgateThreadLabels($threadId: ID!) {
  thread(threadId: $threadId) {
    id
    labels { id labelType { id } }
  }
}"#;

/// Labels taken off a thread (by label id, not label type id).
pub const REMOVE_LABELS: &str = concat!(
    "mutation ThreadgateRemoveLabels($input: RemoveLabelsInput!) {\n",
    "  removeLabels(input: $input) { ",
    mutation_error!(),
    " }\n}"
);

/// Every document, for tests that validate them all against the schema.
pub const ALL: &[&str] = &[
    GET_THREAD,
    THREAD_CUSTOMER,
    THREAD_NOTES,
    REPLY_TO_THREAD,
    CREATE_NOTE,
    ADD_LABELS,
    ASSIGN_THREAD,
    ESCALATE_THREAD,
    MARK_THREAD_AS_DONE,
    CREATE_THREAD_EVENT,
    LABEL_TYPE,
    THREAD_LABELS,
    REMOVE_LABELS,
];
